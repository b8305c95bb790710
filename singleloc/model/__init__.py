"""The model of docs/model.md sections 1-3: activations, priors, the layer and its losses, the data, the exact held-
out risk. Private modules: the public names are ``singleloc``'s."""
