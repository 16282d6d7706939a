#!/usr/bin/env bash
# Starts the local control plane (hack/devcluster: etcd + kube-apiserver on
# loopback with the Sandbox CRD installed and the front proxy configured for
# aggregated API servers) in the background and waits until it answers. Safe to rerun: a healthy control plane is left alone, and a
# stale pid file from a crashed one is cleaned up.
#
# Needs KUBEBUILDER_ASSETS (make dev-up sets it from hack/setup-envtest.sh).
# State lives in bin/dev/: kubeconfig, devcluster.log, devcluster.pid.
set -euo pipefail

log() { echo "dev-up: $*" >&2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

DEV_DIR="bin/dev"
KUBECONFIG_PATH="${DEV_DIR}/kubeconfig"
PID_FILE="${DEV_DIR}/devcluster.pid"
LOG_FILE="${DEV_DIR}/devcluster.log"
BINARY="bin/devcluster"
READY_TIMEOUT="${DEV_UP_TIMEOUT:-120}"
KUBECTL="${KUBECTL:-kubectl}"

# alive PID: the process exists and is not a zombie.
alive() {
  local state
  # The state follows the parenthesised command name, which may hold spaces.
  state=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "${state}" && "${state}" != Z ]]
}

# Prints the pid recorded in the pid file if it still names a live
# devcluster. Checking the command line guards against a recycled pid that
# now belongs to something else.
recorded_pid() {
  [[ -s "${PID_FILE}" ]] || return 1
  local pid
  pid=$(<"${PID_FILE}")
  [[ "${pid}" =~ ^[0-9]+$ ]] && alive "${pid}" || return 1
  tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q "devcluster" || return 1
  echo "${pid}"
}

api_answers() {
  [[ -s "${KUBECONFIG_PATH}" ]] &&
    timeout 10 "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" get sandboxes -A >/dev/null 2>&1
}

print_next_steps() {
  # make dev-up-system goes on to start everything itself.
  [[ "${DEV_UP_NEXT_STEPS:-1}" == 1 ]] || return 0
  cat >&2 <<EOF
dev-up: the control plane is up. Next:
  make run        # the manager for node n1, its node API on 127.0.0.1:9443, and in the
                  # background the operator's quota webhook and aggregated API
                  # (or make dev-up-system: all of that for node dev-node, and the MCP server)
  kubectl --kubeconfig ${KUBECONFIG_PATH} apply -f config/samples/
  kubectl --kubeconfig ${KUBECONFIG_PATH} get sandboxes
  bin/kubectl-sandbox --kubeconfig ${KUBECONFIG_PATH} exec sandbox-sample -- python3 -c 'print(6*7)'
Stop it with: make dev-down
EOF
}

if pid=$(recorded_pid); then
  if api_answers; then
    log "already up (pid ${pid})"
    print_next_steps
    exit 0
  fi
  # Running but not answering: most likely still starting from an earlier
  # invocation. Waiting below handles that; a wedged one times out with its
  # log, and make dev-down clears it.
  log "devcluster (pid ${pid}) is running but not answering yet; waiting"
else
  if [[ -e "${PID_FILE}" ]]; then
    log "removing stale ${PID_FILE}"
    rm -f "${PID_FILE}"
  fi
  # The kubeconfig of a dead control plane points at a closed port.
  rm -f "${KUBECONFIG_PATH}"

  if [[ -z "${KUBEBUILDER_ASSETS:-}" ]]; then
    log "KUBEBUILDER_ASSETS is not set; use 'make dev-up' or KUBEBUILDER_ASSETS=\$(hack/setup-envtest.sh) $0"
    exit 1
  fi
  if [[ ! -x "${KUBEBUILDER_ASSETS}/kube-apiserver" || ! -x "${KUBEBUILDER_ASSETS}/etcd" ]]; then
    log "KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS} lacks kube-apiserver or etcd; run hack/setup-envtest.sh"
    exit 1
  fi
  if [[ ! -s config/crd/bases/sandbox.code-sandbox.dev_sandboxes.yaml ]]; then
    log "config/crd/bases has no Sandbox CRD; run 'make manifests'"
    exit 1
  fi

  mkdir -p "${DEV_DIR}"
  log "building ${BINARY}"
  go build -o "${BINARY}" ./hack/devcluster

  log "starting the control plane (log: ${LOG_FILE})"
  # setsid puts it in its own session, so that it survives this shell and a
  # Ctrl-C in the terminal that ran make does not reach it.
  KUBEBUILDER_ASSETS="${KUBEBUILDER_ASSETS}" nohup setsid "${BINARY}" --kubeconfig "${KUBECONFIG_PATH}" \
    >"${LOG_FILE}" 2>&1 </dev/null &
  pid=$!
  echo "${pid}" >"${PID_FILE}"
fi

deadline=$((SECONDS + READY_TIMEOUT))
until api_answers; do
  # The pid is known to be ours here, so liveness alone is enough (its
  # command line is not "devcluster" until nohup and setsid have exec'd).
  if ! alive "${pid}"; then
    log "devcluster exited before becoming ready; last lines of ${LOG_FILE}:"
    tail -n 30 "${LOG_FILE}" >&2 || true
    rm -f "${PID_FILE}"
    exit 1
  fi
  if ((SECONDS >= deadline)); then
    log "the control plane did not answer within ${READY_TIMEOUT}s; last lines of ${LOG_FILE}:"
    tail -n 30 "${LOG_FILE}" >&2 || true
    log "it is still running (pid ${pid}); 'make dev-down' stops it"
    exit 1
  fi
  sleep 1
done

log "ready (pid ${pid})"
print_next_steps
