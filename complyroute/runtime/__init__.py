"""Running a plan, behind one Target interface (target.py; targets.py makes the one --target
names): on this machine (local/: render, supervise, reload, faults) and on Kubernetes
(kubernetes/: render, validate, apply, images), each with its Target (target.py)."""
