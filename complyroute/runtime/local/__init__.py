"""A deployment on this machine: every part a process under one supervisord (deployment.py),
a new rule set into the running points (reload.py), and faults injected into its parts
(faults.py)."""
