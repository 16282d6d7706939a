#!/usr/bin/env bash
# Starts the whole system on one machine, on top of the local control plane
# that hack/dev-up.sh started (make dev-up-system runs both):
#
#   1. the operator's cluster objects (config/dev): the webhook
#      configuration calling https://127.0.0.1:9444, the user ClusterRoles,
#      namespace code-sandbox-system, ServiceAccount default/agent bound to
#      the editor role, and the demo SandboxQuota default/demo;
#   2. the manager for node dev-node (its node API on 127.0.0.1:9443);
#   3. the SandboxQuota webhook (bin/manager --role webhook) with its
#      self-managed certificate for 127.0.0.1;
#   4. the MCP server on http://127.0.0.1:8080/mcp with the kubernetes
#      backend and ServiceAccount tokens (--auth kubernetes).
#
# Each runs in the background with bin/dev/NAME.pid and bin/dev/NAME.log, and
# is waited for until it is healthy; a component that does not get there
# fails the script with the end of its log. Safe to rerun: healthy
# components are left alone, dead ones are restarted, and all of them are
# restarted when the control plane is a new one (its kubeconfig changed).
# make dev-down stops everything.
set -euo pipefail

log() { echo "dev-up-system: $*" >&2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

DEV_DIR="bin/dev"
KUBECONFIG_PATH="${DEV_DIR}/kubeconfig"
KUBECTL="${KUBECTL:-kubectl}"
KUSTOMIZE="${KUSTOMIZE:-bin/kustomize}"
READY_TIMEOUT="${DEV_UP_TIMEOUT:-120}"

NODE_NAME="dev-node"
NODE_API_ADDR="127.0.0.1:9443"
# Must match the url in config/dev/operator/kustomization.yaml.
WEBHOOK_ADDR="127.0.0.1:9444"
WEBHOOK_NAMESPACE="code-sandbox-system"
WEBHOOK_CONFIGURATION="code-sandbox-validating-webhook-configuration"
MCP_ADDR="${DEV_MCP_ADDR:-127.0.0.1:8080}"
MCP_NAMESPACE="default"
MCP_URL="http://${MCP_ADDR}/mcp"
QUOTA="demo"
IMAGE="${PYTHON_IMAGE:-code-sandbox-test/python:3}"

# Which control plane the running components were started against: a new
# one has a new port and new certificates, so they must be restarted.
CLUSTER_STAMP="${DEV_DIR}/system.cluster"

kc() { timeout 30 "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

# alive PID: the process exists and is not a zombie.
alive() {
  local state
  state=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "${state}" && "${state}" != Z ]]
}

# running NAME BINARY: prints the pid in bin/dev/NAME.pid if that process is
# alive and still runs BINARY (pids are recycled).
running() {
  local f="${DEV_DIR}/$1.pid" pid
  [[ -s "${f}" ]] || return 1
  pid=$(<"${f}")
  [[ "${pid}" =~ ^[0-9]+$ ]] && alive "${pid}" || return 1
  tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q -- "$2" || return 1
  echo "${pid}"
}

# stop NAME BINARY: SIGTERM, then SIGKILL after 30 s.
stop() {
  local pid
  if pid=$(running "$1" "$2"); then
    log "stopping $1 (pid ${pid})"
    kill -TERM "${pid}" 2>/dev/null || true
    local deadline=$((SECONDS + 30))
    while alive "${pid}" && ((SECONDS < deadline)); do sleep 0.5; done
    alive "${pid}" && kill -KILL "${pid}" 2>/dev/null || true
  fi
  rm -f "${DEV_DIR}/$1.pid"
}

# http_ok HOST:PORT PATH: a GET answers 200. Plain bash, no curl needed.
http_ok() {
  local host=${1%:*} port=${1##*:} status
  (
    exec 3<>"/dev/tcp/${host}/${port}" || exit 1
    printf 'GET %s HTTP/1.0\r\nHost: %s\r\n\r\n' "$2" "$1" >&3
    IFS= read -r -t 5 status <&3 || exit 1
    [[ "${status}" == HTTP/1.?" 200"* ]]
  ) 2>/dev/null
}

# port_free PORT: nothing listens on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# health_addr NAME FIRST: picks the first free loopback port from FIRST for
# NAME's health probes and records it in bin/dev/NAME.health, where reruns
# find it.
health_addr() {
  local port=$2
  while ! port_free "${port}"; do port=$((port + 1)); done
  echo "127.0.0.1:${port}" | tee "${DEV_DIR}/$1.health"
}

# fail NAME MESSAGE: explain, show NAME's log and exit.
fail() {
  log "$2; last lines of ${DEV_DIR}/$1.log:"
  tail -n 40 "${DEV_DIR}/$1.log" >&2 || true
  log "'make dev-down' stops what is running"
  exit 1
}

# start NAME BINARY ARGS...: runs BINARY in the background in its own
# session (a Ctrl-C in make's terminal does not reach it) and records it.
start() {
  local name=$1
  shift
  log "starting ${name} (log: ${DEV_DIR}/${name}.log)"
  nohup setsid "$@" >"${DEV_DIR}/${name}.log" 2>&1 </dev/null &
  echo $! >"${DEV_DIR}/${name}.pid"
}

# wait_for NAME CHECK...: runs CHECK until it succeeds; fails with NAME's
# log if the process dies or READY_TIMEOUT passes.
wait_for() {
  local name=$1 pid
  shift
  pid=$(<"${DEV_DIR}/${name}.pid")
  local deadline=$((SECONDS + READY_TIMEOUT))
  until "$@"; do
    alive "${pid}" || { rm -f "${DEV_DIR}/${name}.pid"; fail "${name}" "${name} exited"; }
    ((SECONDS < deadline)) || fail "${name}" "${name} (pid ${pid}) was not ready within ${READY_TIMEOUT}s"
    sleep 1
  done
}

[[ -s "${KUBECONFIG_PATH}" ]] || { log "no ${KUBECONFIG_PATH}: start the control plane first (make dev-up-system does)"; exit 1; }
for bin in bin/manager bin/code-sandbox-mcp "${KUSTOMIZE}"; do
  [[ -x "${bin}" ]] || { log "${bin} is missing; run 'make build kustomize' (make dev-up-system does)"; exit 1; }
done

# A new control plane: what runs was started against the old one.
cluster=$(sha256sum "${KUBECONFIG_PATH}" | cut -d' ' -f1)
if [[ "$(cat "${CLUSTER_STAMP}" 2>/dev/null)" != "${cluster}" ]]; then
  stop mcp code-sandbox-mcp
  stop webhook bin/manager
  stop "manager-${NODE_NAME}" bin/manager
fi
echo "${cluster}" >"${CLUSTER_STAMP}"

# 1. Cluster objects. Applied before the webhook runs: the configuration
# fails closed, so until the webhook answers Sandboxes cannot be created,
# and nothing creates one before then.
log "applying config/dev (webhook configuration, user ClusterRoles, namespace ${WEBHOOK_NAMESPACE}, ServiceAccount ${MCP_NAMESPACE}/agent, SandboxQuota ${MCP_NAMESPACE}/${QUOTA})"
"${KUSTOMIZE}" build config/dev | kc apply --server-side --force-conflicts --field-manager=dev-up-system -f - >/dev/null

# 2. The node's manager, as `make run` runs it.
name="manager-${NODE_NAME}"
if pid=$(running "${name}" bin/manager); then
  log "${name} already runs (pid ${pid})"
else
  health=$(health_addr "${name}" 18081)
  start "${name}" bin/manager --kubeconfig "${KUBECONFIG_PATH}" --node-name "${NODE_NAME}" \
    --node-api-bind-address "${NODE_API_ADDR}" --node-api-advertise-address "${NODE_API_ADDR%:*}" \
    --node-api-client-ca-file "${DEV_DIR}/client-ca.crt" --state-dir "${DEV_DIR}/state" \
    --metrics-bind-address 0 --health-probe-bind-address "${health}"
fi
health=$(<"${DEV_DIR}/${name}.health")
wait_for "${name}" http_ok "${health}" /readyz
log "${name} is ready (node API https://${NODE_API_ADDR}, health http://${health}/readyz)"

# 3. The webhook.
if pid=$(running webhook bin/manager); then
  log "webhook already runs (pid ${pid})"
else
  health=$(health_addr webhook 18091)
  start webhook bin/manager --role webhook --kubeconfig "${KUBECONFIG_PATH}" \
    --webhook-bind-address "${WEBHOOK_ADDR}" --webhook-namespace "${WEBHOOK_NAMESPACE}" \
    --webhook-cert-hosts "${WEBHOOK_ADDR%:*}" --webhook-service "" \
    --webhook-configuration "${WEBHOOK_CONFIGURATION}" \
    --metrics-bind-address 0 --health-probe-bind-address "${health}"
fi
health=$(<"${DEV_DIR}/webhook.health")
wait_for webhook http_ok "${health}" /readyz

ca_injected() {
  local ca
  ca=$(kc get validatingwebhookconfiguration "${WEBHOOK_CONFIGURATION}" \
    -o jsonpath='{range .webhooks[*]}{.clientConfig.caBundle}{" "}{end}' 2>/dev/null) || return 1
  # Every webhook, not just the first.
  [[ -n "${ca}" && "${ca}" != *"  "* && "${ca}" != " "* ]]
}
wait_for webhook ca_injected

# The API server answers through the webhook once it trusts its CA: a
# dry-run create of a Sandbox the demo quota refuses (an image it does not
# allow) must come back with the webhook's refusal, not with "failed
# calling webhook".
webhook_answers() {
  local out
  out=$(kc create --dry-run=server -o name -f - 2>&1 <<EOF
apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  generateName: dev-up-probe-
  namespace: ${MCP_NAMESPACE}
spec:
  image: dev-up-system/probe:never-allowed
  activeDeadlineSeconds: 60
EOF
  ) && return 1
  [[ "${out}" == *"sandbox quota \"${QUOTA}\" does not allow image"* ]]
}
wait_for webhook webhook_answers
log "the webhook answers (https://${WEBHOOK_ADDR}, caBundle injected into ${WEBHOOK_CONFIGURATION})"

# Until the quota controller has counted the namespace, creates are refused
# with "has not counted its usage yet".
quota_counted() {
  local gens
  gens=$(kc get sandboxquota "${QUOTA}" -n "${MCP_NAMESPACE}" -o jsonpath='{.metadata.generation} {.status.observedGeneration}' 2>/dev/null) || return 1
  [[ "${gens% *}" == "${gens#* }" ]]
}
wait_for webhook quota_counted

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
  node manager    ${NODE_NAME}, node API https://${NODE_API_ADDR}     (${DEV_DIR}/manager-${NODE_NAME}.log)
  quota webhook   https://${WEBHOOK_ADDR}                    (${DEV_DIR}/webhook.log)
  MCP server      ${MCP_URL}               (${DEV_DIR}/mcp.log)

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
