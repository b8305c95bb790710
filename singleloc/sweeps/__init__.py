"""Sweeps over configurations: the grid, a point's work, the cache, the dataset, the estimates. Private modules: the
public names are ``singleloc``'s."""
