# The parameters a user gives (make deploy topology=dr6 services=5 ...), the names derived from them,
# and the checks that refuse a bad one with $(error ...) before any recipe runs.

# ---- parameters ---------------------------------------------------------------
topology ?= sidecar
# Number of service instances, or a manifest whose services to deploy; empty keeps the manifest's own.
services ?=
# Where to deploy: local (processes on this machine) or k8s (the current kubectl context).
target ?= local
# How enforcement points decide: empty keeps the manifest's engine.kind (envoy-opa or envoy-compiled).
engine ?=
# The service image render and deploy target=k8s use (name[:tag][@sha256:digest], set in the kustomization's
# images:); empty: complyroute/service:<services/package.json's version>, which `make images` builds.
image ?=
# Run folders `make audit` checks; empty: every one under runs/.
runs ?=
# 0: make k8s-e2e without the real node (kwok's nodes only; its traffic tests are skipped).
real_node ?=
# 1: render for one node that carries every role (labelled complyroute.io/role=all), target=k8s.
one_node ?=
# 1: after deploying, reload the deployment whenever policies/ changes (make deploy watch=1).
watch ?=
# 0: a part of a local deployment that dies stays down (by default supervisord restarts it).
restart ?=
# The rule set: policies (the shipped one), the name of one in rule-sets/ (policy=classification),
# or a folder. deploy keeps the manifest's `policy` unless it is given; reload-policy and
# watch-policy the deployment's.
policy ?= policies
policy_dir := $(if $(filter policies,$(policy)),policies,$(firstword $(wildcard $(addsuffix /complyroute/compliance,rule-sets/$(policy) $(policy)))))
policy_dir := $(patsubst %/complyroute/compliance,%,$(policy_dir))
policy_given := $(if $(filter command line environment,$(origin policy)),--policies $(policy))
known_policies := policies $(notdir $(wildcard rule-sets/*))
# The git ref `make policy-diff` compares the rule set with.
base ?=
# What `make decide` evaluates.
input ?= policies/examples/eu-personal-allowed.json
catalog ?= policies/examples/catalog.json

# ---- which target takes which parameter ------------------------------------------
# A target refuses a parameter it does not read (make experiment topology=nosuch ran the whole matrix
# and said nothing): a parameter given on the command line that no goal of the command takes stops make
# before anything runs. A goal not named here takes none (setup, test, check, experiment, bench, ...).
PARAMETERS := topology services target engine image runs real_node one_node watch restart policy base input catalog upgrade
takes.deploy := topology services target engine image one_node watch restart policy
takes.reload-policy := target topology policy
takes.watch-policy := policy
takes.undeploy := target
takes.status := target topology
takes.audit := target runs
takes.render := topology services engine image one_node
takes.k8s-e2e := real_node
takes.policy-test := policy
takes.decide := policy input catalog
takes.policy-diff := base topology services policy
takes.lock := upgrade
goals := $(or $(MAKECMDGOALS),help)
given := $(foreach p,$(PARAMETERS),$(if $(filter command line,$(origin $(p))),$(p)))
untaken := $(filter-out $(foreach goal,$(goals),$(takes.$(goal))),$(given))
$(if $(untaken),$(error make $(goals) takes no $(foreach p,$(untaken),$(p)=) \
  ($(foreach goal,$(goals),$(goal): $(or $(foreach p,$(takes.$(goal)),$(p)=),no parameter)$(if $(filter-out $(lastword $(goals)),$(goal)),;))): \
  leave it out, or see make help$(if $(filter experiment experiment-classification,$(goals)),; a matrix of your own: python -m experiments run --profile quick --topologies ... --dry-run)))

# Short names a user may type for a topology manifest: each manifest lists its own (aliases: [sa]).
# `aliases` prints "<alias>=<manifest name>" for each.
aliases = $(shell awk '$$1 == "aliases:" { sub(/\#.*/, ""); gsub(/[][,]/, " "); n = FILENAME; sub(/.*\//, "", n); sub(/\.yaml$$/, "", n); for (i = 2; i <= NF; i++) print $$i "=" n }' topologies/*.yaml)
known_aliases = $(foreach a,$(aliases),$(firstword $(subst =, ,$(a))))
topology_name := $(or $(lastword $(subst =, ,$(filter $(topology)=%,$(aliases)))),$(topology))
topology_file := $(firstword $(wildcard $(topology) topologies/$(topology_name).yaml))
known_topologies := $(basename $(notdir $(wildcard topologies/*.yaml)))
known_engines := envoy-opa envoy-compiled

.PHONY: check-policy
check-policy:
	$(if $(policy_dir),,$(error policy='$(policy)' names no rule set: use one of $(known_policies), or a folder holding complyroute/compliance))
	@true

.PHONY: check-base
check-base:
	$(if $(base),,$(error base= is required: the git ref whose rule set policies/ is compared with, such as base=HEAD or base=main))
	@true

.PHONY: check-target
check-target:
	$(if $(filter local k8s,$(target)),,$(error target='$(target)' is unknown: use target=local (processes on this machine, the default) or target=k8s (the current kubectl context)))
	@true

.PHONY: check-image
check-image:
	$(if $(and $(image),$(filter-out k8s,$(target))),$(error image= is the service image on Kubernetes: use it with target=k8s (or make render); a local deployment runs services/ itself))
	@true

.PHONY: check-watch
check-watch:
	$(if $(filter-out 0 1,$(watch)),$(error watch='$(watch)' is unknown: use watch=1 to reload the deployment on every save to policies/, or leave it out))
	$(if $(and $(filter 1,$(watch)),$(filter k8s,$(target))),$(error watch=1 reloads local deployments only: on Kubernetes a new rule set still takes make deploy target=k8s again))
	@true

.PHONY: check-restart
check-restart:
	$(if $(filter-out 0 1,$(restart)),$(error restart='$(restart)' is unknown: use restart=0 to leave a part that dies down, or leave it out))
	$(if $(and $(filter 0,$(restart)),$(filter k8s,$(target))),$(error restart=0 applies to local deployments only: on Kubernetes the kubelet restarts containers))
	@true

.PHONY: check-engine
check-engine:
	$(if $(engine),$(if $(filter $(engine),$(known_engines)),,$(error engine='$(engine)' is unknown: use one of $(known_engines), or leave it out to keep the manifest's)))
	@true

.PHONY: check-topology
check-topology:
	$(if $(topology_file),,$(error topology '$(topology)' is unknown: use one of $(known_topologies), an alias ($(known_aliases)), or a path to a manifest))
	$(if $(services),$(if $(or $(shell [[ '$(services)' =~ ^[1-9][0-9]*$$ ]] && echo ok),$(wildcard $(services))),,$(error services='$(services)' must be a number of service instances (services=5) or a manifest whose services to deploy (services=topologies/examples/mixed-regions.yaml))))
	@true
