"""Reading trajectories (docs/model.md sections 5.9-5.10): plateaus, phases, head classes, linear stability, the
fixed point, escape predictions, attention mass.

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
