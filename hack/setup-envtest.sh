#!/usr/bin/env bash
# Provides envtest's kube-apiserver and etcd, and prints the directory that
# holds them (use it as KUBEBUILDER_ASSETS).
#
# Order of preference:
#   1. KUBEBUILDER_ASSETS, when it is set and holds both binaries;
#   2. the per-user cache (~/.cache/code-sandbox-operator/envtest/<version>);
#   3. setup-envtest, where the internet is reachable;
#   4. an offline build: kube-apiserver compiled from k8s.io/kubernetes through
#      the Go module proxy, etcd from Debian's etcd-server package.
#
# All progress goes to stderr so that callers can capture stdout.
set -euo pipefail

K8S_VERSION="${ENVTEST_K8S_VERSION:-1.37.1}"
CACHE_ROOT="${CODE_SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/code-sandbox-operator}"
ASSETS_DIR="${CACHE_ROOT}/envtest/${K8S_VERSION}"

log() { echo "setup-envtest: $*" >&2; }

have_assets() { [[ -x "$1/kube-apiserver" && -x "$1/etcd" ]]; }

if [[ -n "${KUBEBUILDER_ASSETS:-}" ]] && have_assets "${KUBEBUILDER_ASSETS}"; then
  echo "${KUBEBUILDER_ASSETS}"
  exit 0
fi

if have_assets "${ASSETS_DIR}"; then
  echo "${ASSETS_DIR}"
  exit 0
fi

mkdir -p "${ASSETS_DIR}"

# setup-envtest downloads release binaries; it only works with internet access.
if [[ -n "${SETUP_ENVTEST:-}" && -x "${SETUP_ENVTEST}" ]]; then
  if dir=$("${SETUP_ENVTEST}" use "${K8S_VERSION}" --bin-dir "${CACHE_ROOT}/setup-envtest" -p path 2>/dev/null) && have_assets "${dir}"; then
    cp "${dir}/kube-apiserver" "${dir}/etcd" "${ASSETS_DIR}/"
    [[ -x "${dir}/kubectl" ]] && cp "${dir}/kubectl" "${ASSETS_DIR}/"
    echo "${ASSETS_DIR}"
    exit 0
  fi
  log "setup-envtest could not download ${K8S_VERSION} (no internet?); building offline"
fi

# etcd: Debian's etcd-server.
if [[ ! -x "${ASSETS_DIR}/etcd" ]]; then
  if ! command -v etcd >/dev/null 2>&1 && [[ ! -x /usr/bin/etcd ]]; then
    log "installing Debian's etcd-server"
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends etcd-server >&2 || { apt-get update >&2 && apt-get install -y --no-install-recommends etcd-server >&2; }
    # The package starts a system etcd on the default ports; envtest runs its own.
    (systemctl stop etcd || service etcd stop || pkill -x etcd) >/dev/null 2>&1 || true
  fi
  cp "$(command -v etcd || echo /usr/bin/etcd)" "${ASSETS_DIR}/etcd"
fi

# kube-apiserver: built from source through the module proxy. k8s.io/kubernetes
# points its staging modules at ./staging, so a throwaway module replaces each
# one with its published v0.x version.
if [[ ! -x "${ASSETS_DIR}/kube-apiserver" ]]; then
  log "building kube-apiserver v${K8S_VERSION} from the Go module proxy (takes several minutes)"
  work=$(mktemp -d)
  trap 'rm -rf "${work}"' EXIT
  staging_version="v0.${K8S_VERSION#1.}"
  cd "${work}"
  cat > go.mod <<GOMOD
module envtest-build

go 1.26
GOMOD
  go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" >/dev/null
  modfile=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v${K8S_VERSION}.mod
  {
    echo "require k8s.io/kubernetes v${K8S_VERSION}"
    echo "replace ("
    sed -n '/^replace (/,/^)/p' "${modfile}" | awk '/=>/ {print "\t" $1 " => " $1 " '"${staging_version}"'"}'
    echo ")"
  } >> go.mod
  cat > main.go <<'GOMAIN'
package main

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"

func main() {}
GOMAIN
  GOFLAGS=-mod=mod go mod tidy >&2
  CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags="-s -w" -o "${ASSETS_DIR}/kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver >&2
  mv "${ASSETS_DIR}/kube-apiserver.tmp" "${ASSETS_DIR}/kube-apiserver"
fi

echo "${ASSETS_DIR}"
