#!/usr/bin/env bash
# Loads images from this machine's Docker into every Engine Pod
# (config/engine) of the cluster in $KUBECONFIG: the sandboxes run in the
# Engine Pods' Docker, which cannot pull where there is no registry. Each
# image is saved once and streamed into each Pod's `docker load`; a Pod
# whose Engine has them all (the same image IDs) is skipped. test/cluster
# loads its images with this too (make kind-load-sandbox-images).
#
# Usage: hack/kind-load-sandbox-images.sh IMAGE...
# Environment: ENGINE_NAMESPACE (default code-sandbox-system),
# ENGINE_SELECTOR (default the Engine Pods' labels).
set -euo pipefail

log() { echo "kind-load-sandbox-images: $*" >&2; }

NS="${ENGINE_NAMESPACE:-code-sandbox-system}"
SELECTOR="${ENGINE_SELECTOR:-app.kubernetes.io/name=code-sandbox-operator,app.kubernetes.io/component=engine}"
SOCK=unix:///run/code-sandbox-operator/docker.sock

if [[ $# -eq 0 ]]; then
  log "usage: $0 IMAGE..."
  exit 2
fi
for img in "$@"; do
  docker image inspect "${img}" >/dev/null 2>&1 || { log "image ${img} is not in this Docker (make test-images?)"; exit 1; }
done

kubectl -n "${NS}" wait pod -l "${SELECTOR}" --for=condition=Ready --timeout=180s >/dev/null
mapfile -t pods < <(kubectl -n "${NS}" get pods -l "${SELECTOR}" -o jsonpath='{range .items[*]}{.metadata.name}{" "}{.spec.nodeName}{"\n"}{end}')
if [[ ${#pods[@]} -eq 0 ]]; then
  log "no Engine Pods (${SELECTOR}) in namespace ${NS}"
  exit 1
fi

# An Engine that has every image already (the same IDs) is skipped, so that
# loading again (test/cluster does, before its specs) costs little.
want=$(docker image inspect --format '{{.Id}}' "$@")
tmp=$(mktemp)
trap 'rm -f "${tmp}"' EXIT
for line in "${pods[@]}"; do
  read -r pod node <<<"${line}"
  have=$(kubectl -n "${NS}" exec "${pod}" -c dockerd -- docker --host="${SOCK}" image inspect --format '{{.Id}}' "$@" 2>/dev/null || true)
  if [[ "${have}" == "${want}" ]]; then
    log "${pod} (node ${node}) has $* already"
    continue
  fi
  [[ -s "${tmp}" ]] || docker save "$@" >"${tmp}"
  log "loading $* into ${pod} (node ${node})"
  kubectl -n "${NS}" exec -i "${pod}" -c dockerd -- docker --host="${SOCK}" load -q <"${tmp}" >&2
done
