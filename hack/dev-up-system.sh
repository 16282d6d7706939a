#!/usr/bin/env bash
# Starts the whole system on one machine, on top of the local control plane
# that hack/dev-up.sh started (make dev-up-system runs both), under the trust
# model a cluster has (see hack/dev-lib.sh):
#
#   1. the operator's cluster objects (config/dev): namespace
#      code-sandbox-system, the manager ServiceAccount and its RBAC, the
#      Sandbox status policy, the user ClusterRoles, the webhook
#      configuration calling https://127.0.0.1:9444, the APIService of the
#      aggregated API (served on 127.0.0.1:9445), ServiceAccount
#      default/agent bound to the editor role, and the demo SandboxQuota
#      default/demo;
#   2. the operator's control-plane component, `bin/manager --role control-plane`:
#      the operator CA, the node certificate signer, the SandboxQuota webhook
#      and the aggregated API (sandboxes/exec, files, log, history through
#      kube-apiserver); it goes first, since the managers need its CA;
#   3. the manager for node dev-node (its node API on 127.0.0.1:9443, mutual
#      TLS with the operator CA), authenticated with a token bound to a Pod on
#      dev-node, so that it may write the status of dev-node's Sandboxes
#      only; it requests its node API certificate from the signer;
#   4. the MCP server on http://127.0.0.1:8080/mcp with the kubernetes
#      backend and ServiceAccount tokens (--auth kubernetes).
#
# Each runs in the background with bin/dev/NAME.pid and bin/dev/NAME.log, and
# is waited for until it is healthy; a component that does not get there
# fails the script with the end of its log. Safe to rerun: healthy
# components are left alone, dead ones are restarted, the manager's token is
# renewed, and all of them are restarted when the control plane is a new one
# (its kubeconfig changed). make dev-down stops everything.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"
DEV_LOG_PREFIX=dev-up-system
# shellcheck source=hack/dev-lib.sh
source hack/dev-lib.sh

NODE_NAME="dev-node"
NODE_API_ADDR="127.0.0.1:9443"
MCP_ADDR="${DEV_MCP_ADDR:-127.0.0.1:8080}"
MCP_NAMESPACE="default"
MCP_URL="http://${MCP_ADDR}/mcp"
QUOTA="demo"
IMAGE="${PYTHON_IMAGE:-code-sandbox-test/python:3}"

require_cluster bin/manager bin/code-sandbox-mcp "${KUSTOMIZE}"
restart_if_new_cluster

# 1. Cluster objects.
log "applying config/dev (the operator's objects in namespace ${OPERATOR_NAMESPACE}, ServiceAccount ${MCP_NAMESPACE}/agent, SandboxQuota ${MCP_NAMESPACE}/${QUOTA})"
apply_config config/dev

# 2. The webhook, the aggregated API and the operator CA.
ensure_operator

# Until the quota controller has counted the namespace, creates are refused
# with "has not counted its usage yet".
quota_counted() {
  local gens
  gens=$(kc get sandboxquota "${QUOTA}" -n "${MCP_NAMESPACE}" -o jsonpath='{.metadata.generation} {.status.observedGeneration}' 2>/dev/null) || return 1
  [[ "${gens% *}" == "${gens#* }" ]]
}
wait_for webhook quota_counted

# 3. The node's manager.
ensure_node "${NODE_NAME}" "${NODE_API_ADDR}"

# 4. The MCP server.
if pid=$(running mcp code-sandbox-mcp); then
  log "mcp already runs (pid ${pid})"
else
  if ! port_free "${MCP_ADDR##*:}"; then
    log "${MCP_ADDR} is taken by another process; set DEV_MCP_ADDR to another address"
    exit 1
  fi
  start mcp bin/code-sandbox-mcp --backend kubernetes --auth kubernetes --http "${MCP_ADDR}" \
    --namespace "${MCP_NAMESPACE}" --kubeconfig "${KUBECONFIG_PATH}" \
    --default-image "${IMAGE}" --pull-policy Never
fi
wait_for mcp http_ok "${MCP_ADDR}" /readyz
log "mcp is ready"

cat >&2 <<EOF

dev-up-system: everything is up.
  control plane   ${KUBECONFIG_PATH}                      (${DEV_DIR}/devcluster.log)
  operator        quota webhook https://${WEBHOOK_ADDR},
                  aggregated API https://${APISERVER_ADDR}        (${DEV_DIR}/webhook.log)
  node manager    ${NODE_NAME}, node API https://${NODE_API_ADDR}     (${DEV_DIR}/manager-${NODE_NAME}.log)
  MCP server      ${MCP_URL}               (${DEV_DIR}/mcp.log)

kubectl sandbox reaches Sandboxes through the API server, with any
kubeconfig whose user may use them:

  bin/kubectl-sandbox --kubeconfig ${KUBECONFIG_PATH} exec SANDBOX -- python3 -c 'print(6*7)'

A token for the agent ServiceAccount (it may create and use Sandboxes in
namespace ${MCP_NAMESPACE}):

  TOKEN=\$(${KUBECTL} --kubeconfig ${KUBECONFIG_PATH} create token agent -n ${MCP_NAMESPACE} --duration=24h --audience code-sandbox-mcp)

An MCP client that speaks streamable HTTP (Claude Code, Cursor, VS Code;
see docs/mcp.md):

  {
    "mcpServers": {
      "code-sandbox": {
        "type": "http",
        "url": "${MCP_URL}",
        "headers": { "Authorization": "Bearer <the token>" }
      }
    }
  }

Claude Desktop reads only stdio servers from claude_desktop_config.json;
bridge with mcp-remote (Node.js):

  {
    "mcpServers": {
      "code-sandbox": {
        "command": "npx",
        "args": ["-y", "mcp-remote", "${MCP_URL}", "--allow-http",
                 "--header", "Authorization:\${AUTH_HEADER}"],
        "env": { "AUTH_HEADER": "Bearer <the token>" }
      }
    }
  }

Or by hand:

  curl -sS ${MCP_URL} -H "Authorization: Bearer \$TOKEN" \\
    -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' \\
    -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}'

The demo SandboxQuota allows 3 Sandboxes of the test images at a time; a 4th
sandbox_initialize is refused with the quota's message:

  ${KUBECTL} --kubeconfig ${KUBECONFIG_PATH} get sandboxquotas,sandboxes -n ${MCP_NAMESPACE}

Stop everything with: make dev-down
EOF
kc get sandboxquotas -n "${MCP_NAMESPACE}" >&2 || true
