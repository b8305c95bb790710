"""Pruning (docs/model.md section 7): orders, evaluators, the result. Private modules: the public names are
``singleloc``'s."""
