"""The ground floor: what every other folder uses and which imports nothing of the package above it: the checks of
values and of the API's arguments, the named choices, atomic files, user code and extensions by import path. Private
modules: the public names are ``singleloc``'s."""
