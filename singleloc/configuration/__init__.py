"""The configuration (docs/model.md section 9): the frozen specifications and their checks, the named choices,
presets, user code by import path and the checks at the API's doors.

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
