"""The order-parameter ODE and its solve (docs/model.md section 5): the ODE, integration, starts, the error of
the rule, the SDE, the results and the trajectory record they share (`Trajectory`).

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
