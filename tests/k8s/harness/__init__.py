"""The local Kubernetes cluster the k8s tests run against (localcluster.py), with its one real
node (realnode.py). Test code, not part of the complyroute package: it imports complyroute,
never the other way round. From the repository's root:

    python -m tests.k8s.harness.localcluster import-images   # make images' last step
    python -m tests.k8s.harness.realnode clean               # what a crashed real node left
"""
