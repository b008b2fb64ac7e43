"""Who may talk to whom: the deployment's CA and credentials (pki.py), the parts' SPIFFE
identities (spiffe.py), each point's mutual TLS peers and label-token settings (identity.py),
and the same on Kubernetes (kubetrust.py). Stands on topology/ only."""
