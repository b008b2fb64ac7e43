"""The configuration of an enforcement point's processes, from the plan: Envoy's bootstrap
(envoy.py: listeners, clusters, the label bound and token check), its TLS (tls.py), the answers
Envoy makes itself (replies.py), its routes and their files (routes.py), what every part agrees
on (contract.py: headers, limits, timeouts), and OPA's configuration (opa.py)."""
