"""Run folders: the results of every kind written atomically with their configuration and read back.

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
