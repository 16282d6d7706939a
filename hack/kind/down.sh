#!/usr/bin/env bash
# make kind-down: deletes the kind cluster KIND_CLUSTER and what
# hack/kind/up.sh made for it: its kubeconfig, its generated kind config
# and the docker shim. Sandboxes run in the nodes (the operator's own
# Docker Engine pods), so they go with the node containers. Other kind
# clusters are left alone. Safe to rerun.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh

if cluster_exists; then
  "${KIND}" delete cluster --name "${KIND_CLUSTER}" >&2
else
  log "no kind cluster ${KIND_CLUSTER}"
fi
rm -f "${KIND_KUBECONFIG}" "${KIND_STATE_DIR}/${KIND_CLUSTER}.yaml"
rm -rf "${KIND_SHIM_DIR}" "${KIND_STATE_DIR}/webhook-client"
rmdir "${KIND_STATE_DIR}" 2>/dev/null || true
