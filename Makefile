# code-sandbox-operator

# Image and version stamps.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS ?= -s -w -X github.com/code-sandbox/code-sandbox-operator/internal/version.Version=$(VERSION)

# The Kubernetes version of envtest's kube-apiserver. It matches the minor
# version of the k8s.io modules that controller-runtime pulls in.
ENVTEST_K8S_VERSION ?= 1.37.1

# Per-user cache outside the clone, reused by fresh clones on the same machine.
CODE_SANDBOX_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/code-sandbox-operator
export CODE_SANDBOX_CACHE

# Images the tests run; hack/build-test-images.sh builds them offline.
BUSYBOX_IMAGE ?= code-sandbox-test/busybox:1
PYTHON_IMAGE ?= code-sandbox-test/python:3
export BUSYBOX_IMAGE PYTHON_IMAGE

GO ?= go
SHELL = /usr/bin/env bash -o pipefail
.SHELLFLAGS = -ec

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Display this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: controller-gen ## Generate the CRDs and the manager's and the webhook's RBAC roles.
	$(CONTROLLER_GEN) crd paths="./api/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths="./controllers/sandbox;./internal/nodeapi/...;./internal/nodelease;./internal/operatorca/noderbac" output:rbac:artifacts:config=config/rbac
	$(CONTROLLER_GEN) rbac:roleName=webhook-role paths="./controllers/sandboxquota/...;./controllers/sandboxnode/...;./controllers/sandboxwarmpool/...;./internal/admission/...;./internal/webhookcert/...;./internal/operatorca;./internal/aggregatedapi" output:rbac:artifacts:config=config/webhook

.PHONY: generate
generate: controller-gen ## Generate DeepCopy methods.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./..."

.PHONY: fmt
fmt: ## Run go fmt.
	$(GO) fmt ./...

.PHONY: vet
vet: helper ## Run go vet (including the e2e and benchmark build tags).
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...
	$(GO) vet -tags mcp_e2e ./test/...
	$(GO) vet -tags image ./test/image/

.PHONY: lint
lint: helper golangci-lint ## Run golangci-lint (.golangci.yml: linters, formatting, and the package layering of docs/design.md), with the e2e, mcp_e2e, cluster and image build tags, and check that every package under internal/ and controllers/ has a depguard rule (test/layering).
	$(GOLANGCI_LINT) run
	go test ./test/layering/

.PHONY: lint-fix
lint-fix: helper golangci-lint ## Run golangci-lint and apply its fixes (formatting, imports).
	$(GOLANGCI_LINT) run --fix

.PHONY: verify
verify: manifests generate fmt ## Regenerate everything and fail if the tree changed.
	@if [ -n "$$(git status --porcelain -- api config controllers internal cmd test hack)" ]; then \
		echo "verify: generated files are out of date; run 'make manifests generate fmt' and commit:"; \
		git status --porcelain -- api config controllers internal cmd test hack; \
		git --no-pager diff -- api config controllers internal cmd test hack | head -n 100; \
		exit 1; \
	fi

.PHONY: docker-up
docker-up: ## Make sure a Docker Engine is installed and running.
	hack/ensure-docker.sh

.PHONY: test-images
test-images: docker-up ## Build the test images offline (cached by tag).
	hack/build-test-images.sh

.PHONY: envtest
envtest: ## Provide envtest's kube-apiserver and etcd (cached per user).
	@hack/setup-envtest.sh >/dev/null

.PHONY: test
test: manifests generate helper vet envtest test-images kustomize ## Run unit tests, the envtest suites against the real Docker Engine and the manifests' dry-run.
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test ./... -count=1 -timeout 30m

.PHONY: test-unit
test-unit: helper ## Run the unit tier (go test -short -race): everything that needs neither Docker nor an API server; fails if a test reaches either.
	env -u KUBEBUILDER_ASSETS DOCKER_HOST=unix:///nonexistent/docker.sock KUBECONFIG=/nonexistent/kubeconfig $(GO) test -short -race ./... -timeout 10m

.PHONY: test-e2e
test-e2e: helper build envtest test-images ## Run the end-to-end tests: real binaries against a local control plane and Docker.
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test -tags e2e ./test/e2e/... -count=1 -timeout 20m -v
	$(MAKE) test-e2e-mcp

# The official MCP conformance suite, pinned: CONFORMANCE_VERSION runs over the
# session-based revisions (up to 2025-11-25), CONFORMANCE_2026_VERSION with
# --requirements 2026-07-28 (test/e2e/mcp_conformance_test.go). Each is
# installed from npm once and cached per user (hack/setup-conformance.sh).
CONFORMANCE_VERSION ?= 0.1.16
CONFORMANCE_2026_VERSION ?= 0.2.0-alpha.12
CONFORMANCE_ENV = CODE_SANDBOX_CONFORMANCE="$$(CONFORMANCE_VERSION=$(CONFORMANCE_VERSION) hack/setup-conformance.sh)" \
	CODE_SANDBOX_CONFORMANCE_2026="$$(CONFORMANCE_VERSION=$(CONFORMANCE_2026_VERSION) hack/setup-conformance.sh)"

.PHONY: test-e2e-mcp
test-e2e-mcp: helper test-images ## Run the MCP server's end-to-end tests on the Docker backend (no cluster needed), including the official MCP conformance suite.
	$(CONFORMANCE_ENV) $(GO) test -tags mcp_e2e ./test/e2e/... -count=1 -timeout 20m

.PHONY: test-conformance
test-conformance: helper test-images ## Run only the official MCP conformance suite (npm @modelcontextprotocol/conformance on Node 22, cached per user) against the HTTP server.
	$(CONFORMANCE_ENV) $(GO) test -tags mcp_e2e ./test/e2e/... -count=1 -timeout 20m -ginkgo.label-filter=conformance -v

.PHONY: bench
bench: helper envtest test-images ## Run the benchmarks against raw Docker: create-to-Ready, time to interactive (create + first command, first and repeated exec, 1 KiB write_file), file transfers (1 KiB write_file/read_file p50/p99 vs raw exec and docker cp, through the node API too, a 64 MiB upload), exec round trip, MCP (Docker backend), snapshot and fork x8 of 100 MiB (cold, from a warm pool, and where the time goes), warm pool claims and bursts, the API server's exec path and the MCP kubernetes backend (first and repeated sandbox_exec, write_file 1 KiB). Minutes-long figures only when asked: CODE_SANDBOX_BENCH_DENSITY=500 (idle paused sandboxes and their host memory), CODE_SANDBOX_BENCH_AGENTS=100 (agents looping exec) and CODE_SANDBOX_BENCH_CLAIMS=45 (sustained warm claims per second through the API server, for CODE_SANDBOX_BENCH_CLAIMS_SECONDS=60 from a pool of CODE_SANDBOX_BENCH_CLAIMS_DEPTH members kept full).
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test ./test/bench/... -run '^$$' -bench 'Benchmark[^BF]*$$' -benchtime 20x -count=1 -timeout 20m
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test ./test/bench/... -run '^$$' -bench 'Fork$$|ForkPhases$$' -benchtime 5x -count=1 -timeout 20m
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" $(GO) test ./test/bench/... -run '^$$' -bench 'Burst$$' -benchtime 3x -count=1 -timeout 20m
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" CODE_SANDBOX_LATENCY=1 $(GO) test ./internal/sandboxclient/integration/ -count=1 -v -ginkgo.label-filter=latency
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" CODE_SANDBOX_BENCH=1 $(GO) test -tags e2e ./test/e2e/ -run TestE2E -count=1 -v -timeout 30m -ginkgo.label-filter=bench

##@ Build

.PHONY: build
build: manifests generate helper ## Build bin/manager, bin/code-sandbox-mcp and bin/kubectl-sandbox.
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/manager ./cmd/manager
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/code-sandbox-mcp ./cmd/code-sandbox-mcp
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o bin/kubectl-sandbox ./cmd/kubectl-sandbox

# The in-sandbox helper, embedded by internal/dockerruntime for every node
# architecture. Only rebuilt when its sources change.
HELPER_DIR := internal/dockerruntime/helperbin
HELPER_BINS := $(HELPER_DIR)/code-sandbox-helper-linux-amd64 $(HELPER_DIR)/code-sandbox-helper-linux-arm64
HELPER_SRCS := $(shell find cmd/code-sandbox-helper internal/sandboxhelper internal/execio -name '*.go' ! -name '*_test.go') go.mod

.PHONY: helper
helper: $(HELPER_BINS) ## Build the in-sandbox helper for linux/amd64 and linux/arm64.

$(HELPER_DIR)/code-sandbox-helper-linux-%: $(HELPER_SRCS)
	CGO_ENABLED=0 GOOS=linux GOARCH=$* $(GO) build -trimpath -ldflags "-s -w -buildid=" -o $@ ./cmd/code-sandbox-helper

# IMG is the manager image (the DaemonSet and the webhook Deployment run it),
# MCP_IMG the MCP server's; docker-build builds them and deploy uses them.
IMG ?= code-sandbox-operator/manager:latest
MCP_IMG ?= code-sandbox-operator/mcp-server:latest
# ENGINE_IMG is the Docker Engine image of config/engine (hack/build-engine-image.sh);
# its tag hashes the image's inputs, so a changed input is a new tag.
ENGINE_TAG := $(shell cat hack/build-engine-image.sh hack/engine/entrypoint.sh hack/engine/daemon.json 2>/dev/null | sha256sum | cut -c1-12)
ENGINE_IMG ?= code-sandbox-operator/engine:$(ENGINE_TAG)
# SNAPSHOT_REGISTRY_IMG is the kind cluster's in-cluster snapshot registry
# (config/components/snapshot-registry, hack/build-snapshot-registry-image.sh);
# its tag hashes the image's inputs too (evaluated only where used: the
# hash reads a 30 MB binary).
SNAPSHOT_REGISTRY_TAG = $(shell cat hack/build-snapshot-registry-image.sh /usr/bin/docker-registry 2>/dev/null | sha256sum | cut -c1-12)
SNAPSHOT_REGISTRY_IMG ?= code-sandbox-operator/snapshot-registry:$(SNAPSHOT_REGISTRY_TAG)
# The kustomization deploy, undeploy and build-installer render:
# config/default (an Engine DaemonSet on every node) or config/node-docker
# (the nodes' own Docker Engines). See docs/deploy.md#the-docker-engine.
DEPLOY_CONFIG ?= config/default
# A PEM file with the CA that signs kube-apiserver's webhook client
# certificate (docs/deploy.md#who-may-call-the-webhook-kube-apiservers-client-certificate).
# Set, `make deploy` and `make build-installer` make the webhook require it.
WEBHOOK_CLIENT_CA ?=

.PHONY: docker-build
docker-build: build docker-up ## Build the manager image IMG (with this host's iptables, for its architecture) and the MCP server image MCP_IMG (FROM scratch, offline).
	GO="$(GO)" hack/image-iptables.sh bin/image/manager-root
	docker build --build-arg VERSION=$(VERSION) -t $(IMG) -f Dockerfile .
	docker build --build-arg VERSION=$(VERSION) -t $(MCP_IMG) -f Dockerfile.mcp .

.PHONY: engine-image
engine-image: docker-up ## Build the Docker Engine image ENGINE_IMG offline (debootstrap + Debian's docker.io; root; cached by a tag hashing its inputs).
	hack/build-engine-image.sh $(ENGINE_IMG)

.PHONY: snapshot-registry-image
snapshot-registry-image: docker-up ## Build the kind cluster's snapshot registry image SNAPSHOT_REGISTRY_IMG offline (Debian's docker-registry FROM scratch; cached by a tag hashing its inputs).
	hack/build-snapshot-registry-image.sh $(SNAPSHOT_REGISTRY_IMG)

.PHONY: test-image
test-image: docker-build ## Run the manager image's iptables against this host's Docker rules (root, host network, NET_ADMIN).
	IMG="$(IMG)" MCP_IMG="$(MCP_IMG)" $(GO) test -tags image ./test/image/ -count=1 -v

.PHONY: run
run: build kustomize ## Run the manager for node $$NODE_NAME (default n1) against the local control plane (make dev-up first), the operator's webhook and aggregated API in the background.
	KUSTOMIZE="$(KUSTOMIZE)" hack/dev-run.sh

##@ Release

# make release VERSION=v1.2.3 SIGNING_KEY=~/keys/code-sandbox-release.key
# writes dist/v1.2.3/: an archive per binary and target, checksums.txt and
# its minisign signature (docs/releasing.md). Reproducible: the same commit,
# Go toolchain and VERSION give the same bytes (the build time is the
# commit's, SOURCE_DATE_EPOCH). The secret key never enters the repository.
RELEASE_TARGETS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64
RELEASE_BINARIES ?= code-sandbox-mcp kubectl-sandbox
RELEASE_DIR ?= dist/$(VERSION)
SIGNING_KEY ?=
# A file with SIGNING_KEY's password, when it is encrypted.
SIGNING_KEY_PASSWORD_FILE ?=
# More -ldflags for the release binaries. Only the release tests set it, to
# pin their throwaway key (internal/release.publicKeyOverride).
RELEASE_EXTRA_LDFLAGS ?=

.PHONY: release
release: helper ## Build, archive and sign a release: VERSION=vX.Y.Z SIGNING_KEY=<minisign secret key file> [RELEASE_TARGETS=…] → RELEASE_DIR (dist/VERSION).
	@[ -n "$(SIGNING_KEY)" ] || { echo "make release: SIGNING_KEY=<minisign secret key file> is required (docs/releasing.md)" >&2; exit 2; }
	@[ -z "$$(git status --porcelain --untracked-files=no)" ] || [ -n "$(RELEASE_ALLOW_DIRTY)" ] || { echo "make release: the tree has uncommitted changes, so the release would not be the commit's (RELEASE_ALLOW_DIRTY=1 to build it anyway)" >&2; exit 2; }
	$(GO) run ./hack/release --version "$(VERSION)" --out "$(RELEASE_DIR)" --key "$(SIGNING_KEY)" \
		--password-file "$(SIGNING_KEY_PASSWORD_FILE)" --targets "$(RELEASE_TARGETS)" --binaries "$(RELEASE_BINARIES)" \
		--source-date-epoch "$${SOURCE_DATE_EPOCH:-$$(git log -1 --format=%ct)}" --extra-ldflags "$(RELEASE_EXTRA_LDFLAGS)"

.PHONY: release-key
release-key: ## Make a new release signing key pair: RELEASE_KEY=<file> (and <file>.pub); keep the secret key out of the repository.
	@[ -n "$(RELEASE_KEY)" ] || { echo "make release-key: RELEASE_KEY=<file> is required" >&2; exit 2; }
	$(GO) run ./hack/release keygen --out "$(RELEASE_KEY)"

.PHONY: test-release
test-release: helper ## Build a release of this host's target twice with a throwaway key (bytes compared), then update, roll back and refuse tampered releases with the real binary over HTTP, and run hack/install.sh against it.
	$(GO) test ./test/release/ -count=1 -v -timeout 20m

##@ Cross-platform

# The platforms the MCP server and the kubectl plugin are built for. The
# in-sandbox helper they embed is always linux/amd64 and linux/arm64: that is
# what Docker Desktop runs on Intel and Apple-silicon Macs and on Windows.
CROSS_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64 windows/arm64
CROSS_DIR ?= bin/cross
# Packages vetted, and whose tests are compiled, for Windows and macOS: their
# tests are pure Go (the other packages' tests drive Linux's Docker Engine).
CROSS_TEST_PKGS ?= ./internal/hostfs/ ./cmd/code-sandbox-mcp/ ./cmd/kubectl-sandbox/

.PHONY: cross
cross: helper ## Cross-compile code-sandbox-mcp and kubectl-sandbox for CROSS_PLATFORMS (linux, darwin, windows × amd64, arm64) into CROSS_DIR/<os>-<arch>/.
	@set -e; for p in $(CROSS_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; ext=; if [ "$$os" = windows ]; then ext=.exe; fi; \
	  for cmd in code-sandbox-mcp kubectl-sandbox; do \
	    echo "$(CROSS_DIR)/$$os-$$arch/$$cmd$$ext"; \
	    CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(CROSS_DIR)/$$os-$$arch/$$cmd$$ext ./cmd/$$cmd; \
	  done; \
	done

.PHONY: cross-vet
cross-vet: helper ## Run go vet for windows and darwin on CROSS_TEST_PKGS and compile their tests for both (go test -c): they cannot run on this Linux machine.
	@set -e; for os in windows darwin; do \
	  echo "GOOS=$$os go vet $(CROSS_TEST_PKGS)"; \
	  GOOS=$$os $(GO) vet $(CROSS_TEST_PKGS); \
	  for pkg in $(CROSS_TEST_PKGS); do \
	    echo "GOOS=$$os go test -c $$pkg"; \
	    GOOS=$$os $(GO) test -c -o /dev/null $$pkg; \
	  done; \
	done

##@ Local control plane

.PHONY: dev-up
dev-up: build envtest test-images ## Start etcd + kube-apiserver on loopback, install the CRDs, write bin/dev/kubeconfig.
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" hack/dev-up.sh

.PHONY: dev-up-system
dev-up-system: build envtest test-images kustomize ## dev-up, then the manager for node dev-node, the quota webhook and the MCP server on http://127.0.0.1:8080/mcp, in the background (logs in bin/dev/).
	KUBEBUILDER_ASSETS="$$(hack/setup-envtest.sh)" DEV_UP_NEXT_STEPS=0 hack/dev-up.sh
	KUSTOMIZE="$(KUSTOMIZE)" hack/dev-up-system.sh

.PHONY: dev-down
dev-down: ## Stop everything dev-up and dev-up-system started (Sandboxes are deleted first).
	hack/dev-down.sh

##@ Deployment

.PHONY: install
install: manifests kustomize ## Install the CRDs into the cluster in ~/.kube/config (or KUBECONFIG).
	$(KUSTOMIZE) build config/crd | kubectl apply --server-side -f -

.PHONY: uninstall
uninstall: manifests kustomize ## Remove the CRDs from the cluster.
	$(KUSTOMIZE) build config/crd | kubectl delete --ignore-not-found -f -

# render-default prints $(DEPLOY_CONFIG) (config/default unless set) with the
# images $(IMG), $(MCP_IMG) and $(ENGINE_IMG), and with
# config/components/webhook-client-auth when WEBHOOK_CLIENT_CA is set.
# kubebuilder's scaffold runs `kustomize edit set image` in config/ itself,
# which leaves the tree modified (and the next commit with someone's private
# registry in it); instead this sets the images in a throwaway overlay under
# bin/ (ignored by git) that only refers to $(DEPLOY_CONFIG), and removes it.
define render-default
tmp="$$(mktemp -d "$(LOCALBIN)/.overlay.XXXXXX")"; trap 'rm -rf "$$tmp"' EXIT; \
printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n- ../../$(DEPLOY_CONFIG)\n' >"$$tmp/kustomization.yaml"; \
$(if $(WEBHOOK_CLIENT_CA),printf 'components:\n- ../../config/components/webhook-client-auth\n' >>"$$tmp/kustomization.yaml";) \
(cd "$$tmp" && $(KUSTOMIZE) edit set image code-sandbox-operator/manager=$(IMG) code-sandbox-operator/mcp-server=$(MCP_IMG) code-sandbox-operator/engine=$(ENGINE_IMG) code-sandbox-operator/snapshot-registry=$(SNAPSHOT_REGISTRY_IMG)); \
$(KUSTOMIZE) build "$$tmp"
endef

.PHONY: deploy
deploy: manifests kustomize ## Deploy DEPLOY_CONFIG (default config/default: CRDs, RBAC, the manager and Engine DaemonSets, the webhook and the MCP server; images IMG, MCP_IMG, ENGINE_IMG) to the cluster; WEBHOOK_CLIENT_CA=<pem> makes the webhook require kube-apiserver's client certificate.
	@hack/ensure-mcp-owner-key.sh
	$(if $(WEBHOOK_CLIENT_CA),@hack/ensure-webhook-client-ca.sh "$(WEBHOOK_CLIENT_CA)")
	@if grep -qs 'components/snapshot-registry' $(DEPLOY_CONFIG)/kustomization.yaml; then hack/ensure-snapshot-registry-tls.sh; fi
	@{ $(render-default); } | kubectl apply --server-side -f -

# Sandboxes are deleted first, while the managers still run to remove their
# containers and release the finalizers; deleting the CRDs with the managers
# would leave the containers on the nodes and the Sandboxes stuck.
UNDEPLOY_TIMEOUT ?= 5m

.PHONY: undeploy
undeploy: kustomize ## Delete every Sandbox, then remove everything deploy installed.
	-kubectl delete sandboxes.sandbox.code-sandbox.dev --all --all-namespaces --ignore-not-found --wait --timeout=$(UNDEPLOY_TIMEOUT)
	$(KUSTOMIZE) build $(DEPLOY_CONFIG) | kubectl delete --ignore-not-found -f -

.PHONY: build-installer
build-installer: manifests kustomize ## Write everything deploy installs to dist/install.yaml (DEPLOY_CONFIG; images IMG, MCP_IMG, ENGINE_IMG).
	mkdir -p dist
	@{ $(render-default); } >dist/install.yaml.tmp
	@mv dist/install.yaml.tmp dist/install.yaml
	@echo "wrote dist/install.yaml"

##@ kind

# A three-node kind cluster (one control plane, two workers) from a node
# image built on this machine with no registry (docs/cluster.md#make-the-cluster):
#   make kind-up && export KUBECONFIG=$$PWD/bin/kind-cluster/kubeconfig
#   make kind-deploy          # docker-build, kind-load, deploy
#   make kind-smoke           # nodes, a pod per worker, pod to pod, Service DNS
#   make kind-down
# With a registry, KIND_NODE_IMAGE=kindest/node:v1.37.x make kind-up uses
# kind's own node image and skips the offline build.
# (bin/kind is the kind binary, hence bin/kind-cluster/ for the kubeconfig.)
KIND_CLUSTER ?= code-sandbox
KIND_KUBECONFIG ?= $(LOCALBIN)/kind-cluster/kubeconfig
# Empty: build the node image offline (make kind-image) and use it.
KIND_NODE_IMAGE ?=
# More images for make kind-load, besides IMG and MCP_IMG.
KIND_LOAD_IMAGES ?=
# The offline node image's parts. Kubernetes is ENVTEST_K8S_VERSION (the
# envtest suites and the clusters run the same release); etcd, CoreDNS and
# pause are the tags kubeadm of that release asks for (hack/kind/node-image.sh
# checks), CoreDNS built from KIND_COREDNS_VERSION.
KIND_CONTAINERD_VERSION ?= 2.2.0
KIND_ETCD_VERSION ?= 3.7.0
KIND_COREDNS_VERSION ?= 1.14.7
KIND_COREDNS_TAG ?= v1.14.6
KIND_PAUSE_TAG ?= 3.10.2
KIND_CRICTL_VERSION ?= 1.34.0
KIND_IMAGE_ENV = K8S_VERSION=$(ENVTEST_K8S_VERSION) KIND_VERSION=$(KIND_VERSION) \
	CONTAINERD_VERSION=$(KIND_CONTAINERD_VERSION) KIND_ETCD_VERSION=$(KIND_ETCD_VERSION) \
	KIND_COREDNS_VERSION=$(KIND_COREDNS_VERSION) KIND_COREDNS_TAG=$(KIND_COREDNS_TAG) \
	KIND_PAUSE_TAG=$(KIND_PAUSE_TAG) KIND_CRICTL_VERSION=$(KIND_CRICTL_VERSION)
# The CA of kube-apiserver's webhook client certificate, which hack/kind/up.sh
# makes (hack/kindwebhookclient) and make kind-deploy gives the webhook.
KIND_WEBHOOK_CLIENT_CA ?= $(dir $(KIND_KUBECONFIG))webhook-client/webhook-client-ca.crt
KIND_ENV = KIND="$(KIND)" KIND_CLUSTER="$(KIND_CLUSTER)" KIND_KUBECONFIG="$(KIND_KUBECONFIG)"
# What kind-deploy (and the deploys of test-kind's specs) install:
# config/default plus the in-cluster snapshot registry.
KIND_DEPLOY_CONFIG ?= config/kind/deploy

.PHONY: kind-image
kind-image: docker-up ## Build the kind node image offline (root; Kubernetes ENVTEST_K8S_VERSION, kind KIND_VERSION; parts cached per user), tagged with its versions and a hash of its inputs; skipped when that tag exists.
	$(KIND_IMAGE_ENV) hack/kind/node-image.sh

.PHONY: kind-up
kind-up: kind docker-up $(if $(KIND_NODE_IMAGE),,kind-image) ## Create the kind cluster code-sandbox (KIND_CLUSTER, three nodes) from config/kind/cluster.yaml and the offline node image (or KIND_NODE_IMAGE), write bin/kind-cluster/kubeconfig, wait for the nodes and CoreDNS. Safe to rerun.
	$(KIND_ENV) KIND_NODE_IMAGE="$(or $(KIND_NODE_IMAGE),$$($(KIND_IMAGE_ENV) hack/kind/node-image.sh --print-ref))" hack/kind/up.sh

.PHONY: kind-load
kind-load: kind ## Load IMG, MCP_IMG, ENGINE_IMG and KIND_LOAD_IMAGES from Docker into every kind node (:latest becomes a fixed tag, :kind-<image ID>).
	$(KIND_ENV) hack/kind/load.sh $(IMG) $(MCP_IMG) $(ENGINE_IMG) $(KIND_LOAD_IMAGES)

# The sandboxes' images go into the Engine Pods' Docker, not into the nodes'
# containerd: with no registry they are loaded with `docker load` through
# kubectl exec, into every Engine Pod.
KIND_SANDBOX_IMAGES ?= code-sandbox-test/busybox:1 code-sandbox-test/python:3

.PHONY: kind-load-sandbox-images
kind-load-sandbox-images: ## Load KIND_SANDBOX_IMAGES from this Docker into every Engine Pod of the kind cluster (after kind-deploy and test-images).
	KUBECONFIG="$(KIND_KUBECONFIG)" hack/kind-load-sandbox-images.sh $(KIND_SANDBOX_IMAGES)

.PHONY: kind-deploy
kind-deploy: docker-build engine-image snapshot-registry-image kind ## Build the images, load them into the kind nodes and deploy KIND_DEPLOY_CONFIG (config/default and an in-cluster snapshot registry) to the kind cluster, the webhook requiring kube-apiserver's client certificate; waits for the registry.
	refs=$$($(KIND_ENV) hack/kind/load.sh $(IMG) $(MCP_IMG) $(ENGINE_IMG) $(SNAPSHOT_REGISTRY_IMG)); set -- $$refs; \
	KUBECONFIG="$(KIND_KUBECONFIG)" $(MAKE) deploy DEPLOY_CONFIG="$(KIND_DEPLOY_CONFIG)" IMG="$$1" MCP_IMG="$$2" ENGINE_IMG="$$3" SNAPSHOT_REGISTRY_IMG="$$4" WEBHOOK_CLIENT_CA="$(KIND_WEBHOOK_CLIENT_CA)"
	KUBECONFIG="$(KIND_KUBECONFIG)" kubectl rollout status -n code-sandbox-system deployment/code-sandbox-snapshot-registry --timeout=3m

.PHONY: test-kind
test-kind: build test-images ## Run the Ginkgo suite test/cluster against the operator deployed on the kind cluster (kind-up and kind-deploy first): placement on both workers, warm pools, a manager rollout, an MCP rollout under load and a replica kill, a 150 s command through a 60 s MCP client across a manager and MCP restart, preview URLs through the MCP Service, Egress, node loss, churn with faults (not the MCP scale benchmark: make bench-kind).
	KUBECONFIG="$(KIND_KUBECONFIG)" WEBHOOK_CLIENT_CA="$(KIND_WEBHOOK_CLIENT_CA)" KIND_CLUSTER="$(KIND_CLUSTER)" KIND_KUBECONFIG="$(KIND_KUBECONFIG)" DEPLOY_CONFIG="$(KIND_DEPLOY_CONFIG)" \
		$(GO) test -tags cluster ./test/cluster/... -count=1 -timeout 60m -v -ginkgo.label-filter='!mcp-bench'

.PHONY: bench-kind
bench-kind: build test-images ## Run the slow MCP scale benchmark on the kind cluster (kind-up and kind-deploy first): 100 agents doing init, exec and stop through 1 and then 3 MCP replicas, against raw Docker in the Engine pods, reported as ratios.
	KUBECONFIG="$(KIND_KUBECONFIG)" WEBHOOK_CLIENT_CA="$(KIND_WEBHOOK_CLIENT_CA)" KIND_CLUSTER="$(KIND_CLUSTER)" KIND_KUBECONFIG="$(KIND_KUBECONFIG)" DEPLOY_CONFIG="$(KIND_DEPLOY_CONFIG)" \
		$(GO) test -tags cluster ./test/cluster/... -count=1 -timeout 40m -v -ginkgo.label-filter=mcp-bench

.PHONY: kind-smoke
kind-smoke: kind test-images ## Check the kind cluster: three Ready nodes, a pod on each worker, pod to pod across nodes, Service DNS.
	$(KIND_ENV) hack/kind/smoke.sh

# Sandboxes run inside the nodes (the operator's Docker Engine pods), so
# they go with the cluster.
.PHONY: kind-down
kind-down: kind ## Delete the kind cluster KIND_CLUSTER, its kubeconfig and the docker shim (other kind clusters stay).
	$(KIND_ENV) hack/kind/down.sh

##@ Dependencies

LOCALBIN ?= $(shell pwd)/bin
$(LOCALBIN):
	mkdir -p $(LOCALBIN)

CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen
KUSTOMIZE ?= $(LOCALBIN)/kustomize
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint
KIND ?= $(LOCALBIN)/kind
# test/manifests renders config/ with it.
export KUSTOMIZE

## Tool versions. They must build with the Go toolchain in go.mod.
CONTROLLER_TOOLS_VERSION ?= v0.23.0
KUSTOMIZE_VERSION ?= v5.8.0
GOLANGCI_LINT_VERSION ?= v2.15.0
# v0.33: its kubeadm config is v1beta4, which kubeadm 1.37 needs (v0.31
# writes v1beta3); docs/cluster.md#make-the-cluster. Its own node image is
# kindest/node:v1.37.0, the envtest minor version.
KIND_VERSION ?= v0.33.0

.PHONY: controller-gen
controller-gen: $(CONTROLLER_GEN) ## Download controller-gen locally if necessary.
$(CONTROLLER_GEN): $(LOCALBIN)
	$(call go-install-tool,$(CONTROLLER_GEN),sigs.k8s.io/controller-tools/cmd/controller-gen,$(CONTROLLER_TOOLS_VERSION))

.PHONY: kustomize
kustomize: $(KUSTOMIZE) ## Download kustomize locally if necessary.
$(KUSTOMIZE): $(LOCALBIN)
	$(call go-install-tool,$(KUSTOMIZE),sigs.k8s.io/kustomize/kustomize/v5,$(KUSTOMIZE_VERSION))

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT) ## Download golangci-lint locally if necessary.
$(GOLANGCI_LINT): $(LOCALBIN)
	$(call go-install-tool,$(GOLANGCI_LINT),github.com/golangci/golangci-lint/v2/cmd/golangci-lint,$(GOLANGCI_LINT_VERSION))

.PHONY: kind
kind: $(KIND) ## Download kind locally if necessary.
$(KIND): $(LOCALBIN)
	$(call go-install-tool,$(KIND),sigs.k8s.io/kind,$(KIND_VERSION))

# go-install-tool installs a pinned tool as bin/<name>-<version> and links
# bin/<name> to it, so a version bump reinstalls.
define go-install-tool
@[ -f "$(1)-$(3)" ] && [ "$$(readlink -- "$(1)" 2>/dev/null)" = "$$(basename "$(1)-$(3)")" ] || { \
set -e; \
package=$(2)@$(3) ;\
echo "Downloading $${package}" ;\
rm -f "$(1)" ;\
GOBIN="$(LOCALBIN)" $(GO) install $${package} ;\
mv "$(LOCALBIN)/$$(basename "$(1)")" "$(1)-$(3)" ;\
} ;\
ln -sf "$$(basename "$(1)-$(3)")" "$(1)"
endef
