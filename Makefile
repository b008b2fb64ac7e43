# complyroute: one Rego rule set deciding where personal data may flow, enforced by
# Envoy + OPA in several deployment topologies. `make` lists the targets.

.DEFAULT_GOAL := help
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c

# One file per section of `make help`, in its order (help reads them in this order). params.mk
# comes first: its names, and setup.mk's tool paths, are expanded in later files' prerequisites.
include make/params.mk         # topology=, services=, target=, engine=, policy= ... and their checks
include make/setup.mk
include make/policy.mk
include make/test.mk
include make/deploy.mk
include make/k8s.mk
include make/experiments.mk
include make/housekeeping.mk
