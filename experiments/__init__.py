"""complyroute experiments: the paper's load experiment over the deployment topologies.

`python -m experiments run` deploys each cell of the matrix (topology x rate x services x
repetition), drives it with Locust, and keeps every request; `python -m experiments report`
turns a run's raw data into tables, figures and report.md / report.html. See README.md.
"""
