"""Files and the checks before a run: atomic files, run folders, memory and cost checks, checks after a run.

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
