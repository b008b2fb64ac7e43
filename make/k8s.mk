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
	COMPLYROUTE_REAL_NODE=$(if $(filter 0,$(real_node)),0,1) $(PY) -m pytest -m k8s tests/k8s --durations=25
