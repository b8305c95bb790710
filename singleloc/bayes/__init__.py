"""The Bayes-optimal baseline and the population risk of a layer with its error (docs/model.md section 6). Private
modules: the public names are ``singleloc``'s."""
