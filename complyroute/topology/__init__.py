"""Where the parts of a deployment stand: the manifest (topology/manifest.py), the plan a
topology's placement makes of it (plan.py: enforcement points, their listeners and endpoints,
the service processes), and how the control plane reaches what listens on a unix socket
(localhttp.py). The layer above files.py: it imports nothing else of complyroute."""
