"""The rule set as files and data: where it lives and what OPA is run with (policyfiles.py), the
label schema it declares (labels.py), the catalog data a point decides with (policydata.py),
the bundles and their revision (bundles.py), and the server the points fetch them from
(bundleserver.py, standard library and trust/spiffe.py only: on Kubernetes it runs alone)."""
