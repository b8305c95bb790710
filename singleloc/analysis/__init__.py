"""Reading trajectories (docs/model.md sections 5.9-5.10): plateaus, phases, head classes, linear stability, the fixed
point, escape predictions and horizons, attention mass, the answers of a sweep's rows (heads needed, gap to the Bayes
risk). Private modules: the public names are ``singleloc``'s."""
