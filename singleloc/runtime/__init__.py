"""How computations run: compiled programs kept across processes, devices, Dask, numerical thresholds, progress and
timings. Private modules: the public names are ``singleloc``'s."""
