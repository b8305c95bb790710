"""The normalization-limit diagnostics of attention maps (docs/model.md section 8). Private modules: the public names
are ``singleloc``'s."""
