# shellcheck shell=bash
# What make run (hack/dev-run.sh) and make dev-up-system
# (hack/dev-up-system.sh) share: bookkeeping of the background processes in
# bin/dev/, and the operator as a cluster has it, on top of the local control
# plane (hack/dev-up.sh):
#
#   - config/dev/operator: namespace code-sandbox-system, the manager
#     ServiceAccount and its RBAC, the Sandbox status policy, the user
#     ClusterRoles, the SandboxQuota webhook configuration (calling
#     https://127.0.0.1:9444) and the APIService of the aggregated API (an
#     ExternalName Service for localhost, port 9445);
#   - the operator's control-plane component, `bin/manager --role control-plane`
#     (bin/dev/webhook.{pid,log}): it keeps the operator CA (Secret
#     code-sandbox-operator-ca, bundle ConfigMap
#     code-sandbox-operator-ca-bundle), signs the node managers' node API
#     certificates, serves the SandboxQuota webhook on 127.0.0.1:9444 and the
#     aggregated API on 127.0.0.1:9445, and injects its CA into the webhook
#     configuration and the APIService;
#   - node managers (bin/dev/manager-NODE.{pid,log}), each with a kubeconfig
#     holding the manager ServiceAccount's token bound to a Pod on its node
#     (hack/dev-node-kubeconfig.sh, bin/dev/manager-NODE.kubeconfig).
#
# Source it from the repository root, with DEV_LOG_PREFIX set to the
# caller's name for its messages. KUBECTL, KUSTOMIZE, DEV_UP_TIMEOUT and
# DEV_NODE_TOKEN_DURATION may come from the environment; the rest is fixed.

log() { echo "${DEV_LOG_PREFIX:-dev}: $*" >&2; }

DEV_DIR="bin/dev"
KUBECONFIG_PATH="${DEV_DIR}/kubeconfig"
KUBECTL="${KUBECTL:-kubectl}"
KUSTOMIZE="${KUSTOMIZE:-bin/kustomize}"
READY_TIMEOUT="${DEV_UP_TIMEOUT:-120}"

OPERATOR_NAMESPACE="code-sandbox-system"
# Both must match config/dev/operator/kustomization.yaml.
WEBHOOK_ADDR="127.0.0.1:9444"
APISERVER_ADDR="127.0.0.1:9445"
WEBHOOK_CONFIGURATION="code-sandbox-validating-webhook-configuration"
APISERVICE="v1alpha1.subresources.sandbox.code-sandbox.dev"
# The names the aggregated API's serving certificate must cover: kube-apiserver
# checks it against the Service's name.
APISERVER_SERVICE="code-sandbox-apiserver"
APISERVER_HOSTS="127.0.0.1,${APISERVER_SERVICE}.${OPERATOR_NAMESPACE}.svc"
# How long the node managers' Pod-bound tokens last; rerunning make run or
# make dev-up-system renews them.
NODE_TOKEN_DURATION="${DEV_NODE_TOKEN_DURATION:-24h}"

# Which control plane the running components were started against: a new
# one has a new port and new certificates, so they must be restarted.
CLUSTER_STAMP="${DEV_DIR}/system.cluster"

kc() { timeout 30 "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" "$@"; }

# alive PID: the process exists and is not a zombie.
alive() {
  local state
  # The state follows the parenthesised command name, which may hold spaces.
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

# require_cluster BINARIES...: the control plane's kubeconfig and the
# binaries exist.
require_cluster() {
  [[ -s "${KUBECONFIG_PATH}" ]] || { log "no ${KUBECONFIG_PATH}: start the control plane first (make dev-up)"; exit 1; }
  local bin
  for bin in "$@"; do
    [[ -x "${bin}" ]] || { log "${bin} is missing; run 'make build kustomize'"; exit 1; }
  done
}

# restart_if_new_cluster: what runs was started against an earlier control
# plane if the kubeconfig changed; stop all of it.
restart_if_new_cluster() {
  local cluster f name
  cluster=$(sha256sum "${KUBECONFIG_PATH}" | cut -d' ' -f1)
  if [[ "$(cat "${CLUSTER_STAMP}" 2>/dev/null)" != "${cluster}" ]]; then
    stop mcp code-sandbox-mcp
    stop webhook bin/manager
    shopt -s nullglob
    for f in "${DEV_DIR}"/manager-*.pid; do
      name=$(basename "${f}" .pid)
      stop "${name}" bin/manager
    done
    shopt -u nullglob
    # Their tokens were issued by the old control plane.
    rm -f "${DEV_DIR}"/manager-*.kubeconfig "${DEV_DIR}"/manager-*.kubeconfig.token
  fi
  echo "${cluster}" >"${CLUSTER_STAMP}"
}

# apply_config DIR: renders the kustomization DIR and applies it. The
# webhook configuration fails closed, so until the webhook answers
# Sandboxes cannot be created; nothing creates one before then.
apply_config() {
  "${KUSTOMIZE}" build "$1" | kc apply --server-side --force-conflicts --field-manager=dev-up-system -f - >/dev/null
}

# ca_injected: every webhook of the configuration and the APIService carry
# a caBundle.
ca_injected() {
  local ca
  ca=$(kc get validatingwebhookconfiguration "${WEBHOOK_CONFIGURATION}" \
    -o jsonpath='{range .webhooks[*]}{.clientConfig.caBundle}{" "}{end}' 2>/dev/null) || return 1
  # Every webhook, not just the first.
  [[ -n "${ca}" && "${ca}" != *"  "* && "${ca}" != " "* ]] || return 1
  ca=$(kc get apiservice "${APISERVICE}" -o jsonpath='{.spec.caBundle}' 2>/dev/null) || return 1
  [[ -n "${ca}" ]]
}

# webhook_answers: the API server calls the webhook (it trusts its CA). A
# dry-run create of a Sandbox comes back either admitted (no quota in the
# namespace) or refused by the webhook, never with "failed calling webhook".
webhook_answers() {
  local out
  out=$(kc create --dry-run=server -o name -f - 2>&1 <<EOF
apiVersion: sandbox.code-sandbox.dev/v1alpha1
kind: Sandbox
metadata:
  generateName: dev-up-probe-
  namespace: default
spec:
  image: dev-up-system/probe:never-allowed
  activeDeadlineSeconds: 60
EOF
  ) && return 0
  [[ "${out}" == *'admission webhook "sandbox-quota.code-sandbox.dev" denied the request'* ]]
}

# apiservice_available: kube-apiserver reaches the aggregated API server,
# trusts its certificate and reads its discovery document.
apiservice_available() {
  [[ "$(kc get apiservice "${APISERVICE}" -o jsonpath='{.status.conditions[?(@.type=="Available")].status}' 2>/dev/null)" == True ]]
}

# ensure_operator: starts `bin/manager --role control-plane` unless it runs, and
# waits until it is healthy, its CA is injected, the API server calls its
# webhook and serves its aggregated API. Apply config/dev/operator first.
ensure_operator() {
  local pid health
  if pid=$(running webhook bin/manager); then
    log "webhook already runs (pid ${pid})"
  else
    for addr in "${WEBHOOK_ADDR}" "${APISERVER_ADDR}"; do
      port_free "${addr##*:}" || { log "${addr} is taken by another process"; exit 1; }
    done
    health=$(health_addr webhook 18091)
    start webhook bin/manager --role control-plane --kubeconfig "${KUBECONFIG_PATH}" \
      --webhook-namespace "${OPERATOR_NAMESPACE}" \
      --webhook-bind-address "${WEBHOOK_ADDR}" --webhook-service "" \
      --webhook-client-ca "${DEV_DIR}/webhook-client/webhook-client-ca.crt" \
      --webhook-configuration "${WEBHOOK_CONFIGURATION}" \
      --apiserver-bind-address "${APISERVER_ADDR}" --apiserver-service "${APISERVER_SERVICE}" \
      --apiservice "${APISERVICE}" --webhook-cert-hosts "${APISERVER_HOSTS}" \
      --metrics-bind-address 0 --health-probe-bind-address "${health}"
  fi
  health=$(<"${DEV_DIR}/webhook.health")
  wait_for webhook http_ok "${health}" /readyz
  wait_for webhook ca_injected
  wait_for webhook webhook_answers
  wait_for webhook apiservice_available
  log "the operator answers: quota webhook https://${WEBHOOK_ADDR}, aggregated API https://${APISERVER_ADDR} (APIService ${APISERVICE} Available)"
}

# node_kubeconfig NODE: prints the path of a kubeconfig for NODE's manager
# with a freshly issued Pod-bound token (see hack/dev-node-kubeconfig.sh).
node_kubeconfig() {
  local out="${DEV_DIR}/manager-$1.kubeconfig"
  KUBECTL="${KUBECTL}" OPERATOR_NAMESPACE="${OPERATOR_NAMESPACE}" NODE_ADDRESS="${NODE_ADDRESS:-127.0.0.1}" \
    hack/dev-node-kubeconfig.sh "${KUBECONFIG_PATH}" "$1" "${out}" "${NODE_TOKEN_DURATION}"
  echo "${out}"
}

# node_args NODE KUBECONFIG NODE_API_ADDR HEALTH_ADDR: the manager's
# arguments for NODE, with its node API on NODE_API_ADDR.
node_args() {
  echo --kubeconfig "$2" --node-name "$1" --operator-namespace "${OPERATOR_NAMESPACE}" \
    --node-api-bind-address "$3" --node-api-advertise-address "${3%:*}" \
    --state-dir "${DEV_DIR}/state" --metrics-bind-address 0 --health-probe-bind-address "$4"
}

# has_node_certificate NAME: the manager logged its node API certificate
# (the signer approved its CSR).
has_node_certificate() {
  grep -q "serving a new node API certificate" "${DEV_DIR}/$1.log"
}

# ensure_node NODE NODE_API_ADDR: starts NODE's manager in the background
# unless it runs (renewing its token either way) and waits until it is
# ready and serves its node API with a certificate from the operator CA.
ensure_node() {
  local name="manager-$1" pid kubeconfig health
  kubeconfig=$(NODE_ADDRESS="${2%:*}" node_kubeconfig "$1")
  if pid=$(running "${name}" bin/manager); then
    log "${name} already runs (pid ${pid})"
  else
    port_free "${2##*:}" || { log "$2 is taken by another process"; exit 1; }
    health=$(health_addr "${name}" 18081)
    # shellcheck disable=SC2046 # node_args prints words without spaces
    start "${name}" bin/manager $(node_args "$1" "${kubeconfig}" "$2" "${health}")
  fi
  health=$(<"${DEV_DIR}/${name}.health")
  wait_for "${name}" http_ok "${health}" /readyz
  wait_for "${name}" has_node_certificate "${name}"
  log "${name} is ready (node API https://$2, health http://${health}/readyz)"
}
