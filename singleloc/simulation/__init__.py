"""Finite-D online SGD (docs/model.md section 5.1) and its result. Private modules: the public names are
``singleloc``'s."""
