"""Running a plan: on this machine (local/: render, supervise, reload, faults) and on
Kubernetes (kubernetes/: render, validate, apply, images)."""
