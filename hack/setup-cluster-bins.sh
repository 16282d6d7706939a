#!/usr/bin/env bash
# Provides the Kubernetes and containerd binaries of the offline kind node
# image (make kind-image, hack/kind/node-image.sh) and prints the directory
# that holds them:
#   kube-apiserver, kube-controller-manager, kube-scheduler, kubelet,
#   kube-proxy, kubectl, kubeadm
#                         built from k8s.io/kubernetes in ONE go build, so the
#                         packages they share compile once (kubeadm is for
#                         the kind node image, hack/kind/node-image.sh);
#   containerd, containerd-shim-runc-v2, ctr
#                         containerd 2.x from its Go module (Kubernetes 1.36+
#                         refuses Debian's containerd 1.6), one go build;
# CoreDNS (with the plugins kubeadm's Corefile uses), etcd and crictl are
# built by hack/kind/node-image.sh; runc, the CNI plugins and conntrack come
# from Debian's packages, in the node image's root filesystem. Everything is cached per user, next to
# the envtest binaries, and only the Go module proxy is needed.
#
# All progress goes to stderr so that callers can capture stdout.
set -euo pipefail

K8S_VERSION="${CLUSTER_K8S_VERSION:-${ENVTEST_K8S_VERSION:-1.37.1}}"
CONTAINERD_VERSION="${CONTAINERD_VERSION:-2.2.0}"
CACHE_ROOT="${CODE_SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/code-sandbox-operator}"
BIN_DIR="${CACHE_ROOT}/cluster/${K8S_VERSION}"

log() { echo "setup-cluster-bins: $*" >&2; }

k8s_bins=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm)
have_all() {
  local b
  for b in "${k8s_bins[@]}" containerd containerd-shim-runc-v2 ctr; do
    [[ -x "${BIN_DIR}/$b" ]] || return 1
  done
}
if have_all; then
  echo "${BIN_DIR}"
  exit 0
fi
mkdir -p "${BIN_DIR}"
export GOTOOLCHAIN=local CGO_ENABLED=0
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

build_kubernetes() {
  # Only the missing ones: a cache made before kubeadm was added gets just
  # kubeadm, which reuses the compiled packages it shares with the others.
  local missing=() b
  for b in "${k8s_bins[@]}"; do [[ -x "${BIN_DIR}/$b" ]] || missing+=("$b"); done
  ((${#missing[@]})) || return 0
  log "building Kubernetes v${K8S_VERSION} (${missing[*]}) from the Go module proxy; 20-40 minutes on 2 cores when nothing is compiled yet"
  local dir="${work}/kubernetes" staging_version="v0.${K8S_VERSION#1.}"
  mkdir -p "${dir}/out" && cd "${dir}"
  printf 'module cluster-build\n\ngo 1.26\n' > go.mod
  go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" >/dev/null
  local modfile
  modfile=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v${K8S_VERSION}.mod
  {
    echo "require k8s.io/kubernetes v${K8S_VERSION}"
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "${modfile}" | awk '/=>/ {print "\t" $1 " => " $1 " '"${staging_version}"'"}'
    echo ")"
  } >> go.mod
  {
    echo "package main"
    echo
    # What the commands' main packages import, so that tidy records every
    # module they need (kubectl has no app package; its code lives in the
    # k8s.io/kubectl staging module).
    for b in "${k8s_bins[@]}"; do
      if [[ $b == kubectl ]]; then
        echo "import _ \"k8s.io/kubectl/pkg/cmd\""
        echo "import _ \"k8s.io/client-go/plugin/pkg/client/auth\""
      else
        echo "import _ \"k8s.io/kubernetes/cmd/$b/app\""
      fi
    done
    echo
    echo "func main() {}"
  } > main.go
  GOFLAGS=-mod=mod go mod tidy >&2
  # The version the components report (kubelet and kube-proxy register it on
  # the Node; skew checks read it).
  local ldflags="-s -w"
  local v
  for v in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X ${v}.gitVersion=v${K8S_VERSION} -X ${v}.gitMajor=1 -X ${v}.gitMinor=$(cut -d. -f2 <<<"${K8S_VERSION}") -X ${v}.gitTreeState=clean"
  done
  local pkgs=()
  for b in "${missing[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
  GOFLAGS=-mod=mod go build -trimpath -ldflags="${ldflags}" -o out/ "${pkgs[@]}" >&2
  for b in "${missing[@]}"; do mv "out/$b" "${BIN_DIR}/$b"; done
}

build_containerd() {
  [[ -x "${BIN_DIR}/containerd" && -x "${BIN_DIR}/containerd-shim-runc-v2" && -x "${BIN_DIR}/ctr" ]] && return 0
  log "building containerd v${CONTAINERD_VERSION} from the Go module proxy"
  local dir="${work}/containerd"
  mkdir -p "${dir}/out" && cd "${dir}"
  printf 'module containerd-build\n\ngo 1.26\n' > go.mod
  printf 'package main\n\nimport (\n\t_ "github.com/containerd/containerd/v2/cmd/containerd"\n\t_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"\n\t_ "github.com/containerd/containerd/v2/cmd/ctr"\n)\n\nfunc main() {}\n' > main.go
  GOFLAGS=-mod=mod go get "github.com/containerd/containerd/v2@v${CONTAINERD_VERSION}" >&2
  GOFLAGS=-mod=mod go mod tidy >&2
  GOFLAGS=-mod=mod go build -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v${CONTAINERD_VERSION}" \
    -o out/ github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr >&2
  mv out/containerd out/containerd-shim-runc-v2 out/ctr "${BIN_DIR}/"
}

build_containerd
build_kubernetes
echo "${BIN_DIR}"
