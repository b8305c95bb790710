"""Online SGD (docs/model.md sections 5, 11): the rule as an interface, its variants. Private modules: the public
names are ``singleloc``'s."""
