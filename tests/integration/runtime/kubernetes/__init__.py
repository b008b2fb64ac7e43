"""The Kubernetes manifests every topology renders to (runtime/kubernetes/), read, validated
and run in part on this machine: no cluster (tests/k8s/ has the real one)."""
