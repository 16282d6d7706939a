#!/usr/bin/env bash
# make run: the manager for node NODE_NAME (default n1) in the foreground,
# against the local control plane (make dev-up), with its node API on
# 127.0.0.1:9443. What it needs runs as in a cluster (hack/dev-lib.sh): the
# operator's objects (config/dev/operator) are applied, the operator's
# control-plane component (`bin/manager --role control-plane`: the operator CA,
# the node certificate signer, the quota webhook and the aggregated API
# that kubectl sandbox goes through) is started in the background unless it
# runs, and the manager authenticates with a token bound to a Pod on its
# node. Ctrl-C stops the manager; make dev-down stops the rest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
DEV_LOG_PREFIX=run
# shellcheck source=hack/dev-lib.sh
source hack/dev-lib.sh

NODE_NAME="${NODE_NAME:-n1}"
NODE_API_ADDR="${NODE_API_ADDR:-127.0.0.1:9443}"
HEALTH_ADDR="${HEALTH_ADDR:-127.0.0.1:8081}"

require_cluster bin/manager "${KUSTOMIZE}"
restart_if_new_cluster
if pid=$(running "manager-${NODE_NAME}" bin/manager); then
  log "a manager for node ${NODE_NAME} already runs in the background (pid ${pid}, make dev-up-system); use another NODE_NAME"
  exit 1
fi

if ! port_free "${NODE_API_ADDR##*:}"; then
  log "${NODE_API_ADDR} is taken (by make dev-up-system's manager?); set NODE_API_ADDR to another address"
  exit 1
fi

log "applying config/dev/operator (the operator's objects in namespace ${OPERATOR_NAMESPACE})"
apply_config config/dev/operator
ensure_operator
kubeconfig=$(NODE_ADDRESS="${NODE_API_ADDR%:*}" node_kubeconfig "${NODE_NAME}")

log "running the manager for node ${NODE_NAME} (node API https://${NODE_API_ADDR}); Ctrl-C stops it"
# shellcheck disable=SC2046 # node_args prints words without spaces
exec bin/manager $(node_args "${NODE_NAME}" "${kubeconfig}" "${NODE_API_ADDR}" "${HEALTH_ADDR}")
