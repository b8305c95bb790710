"""The checks before a run and their numbers, called by the entry points before anything is built: memory,
saved times and quadrature sizes, the time estimates and their costs; and the checks after a run.

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
