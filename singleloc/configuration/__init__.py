"""The configuration (docs/model.md section 9): the frozen specifications and their checks, ``Config`` and
its TOML files, the presets and the checks of combinations.

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
