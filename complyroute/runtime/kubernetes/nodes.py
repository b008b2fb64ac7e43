"""The labels that place a topology's pods on a cluster's nodes: an operator labels the nodes,
a rendering selects them (render.py), the Kubernetes target checks them (target.py)."""

NODE_LABEL = "complyroute.io/node"
ROLE_LABEL = "complyroute.io/role"
# A one-node rendering (Renderer(one_node=True), render --one-node) puts every pod on the node
# labelled complyroute.io/role=all: the gateway's and every service node's pods, and one pod of
# each router DaemonSet, which carries its slot's routers of every logical node.
ONE_NODE_ROLE = "all"
