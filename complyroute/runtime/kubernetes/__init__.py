"""A topology on Kubernetes: render.py renders it to manifests (from the same manifest and
placement as a local deploy), validate.py checks them offline against the pinned Kubernetes
version's strict schemas, apply.py applies them to the current kubectl context and reads,
reloads and deletes what it applied; target.py is all of it as the runtime's Target. nodes.py
names the node labels all of them share."""
