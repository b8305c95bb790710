"""The expectation routes (docs/model.md sections 4, 5.4): the interface, the route decision, the Sobol rule, the
exact Laplace form, plain Monte Carlo.

Private modules: the public names are ``singleloc``'s (``import singleloc as sl``)."""
