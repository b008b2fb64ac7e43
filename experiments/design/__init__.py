"""What a run measures and where: the matrix (matrix.py: a run's parameters, the profiles that
preset them, the cells they span, the saturation thresholds), the capacity search (capacity.py:
its parameters, how it steps the rate, when a step is held, and a search's result read back from
its steps), the rule-set change that `reload` measures (changeability.py: the change, the
records sent across it, what is measured of each cell), and where cells deploy (targets.py: the
experiments' side of the runtime's Target: the target the command line makes, the record a
cell's entry must pass, what a target cannot measure and how a report says where a run ran).

Above load/ (a matrix names its mixes and arrivals); below everything that runs, analyses or
reports a run."""
