#!/usr/bin/env bash
# Stops what make dev-up and make dev-up-system started: every process
# recorded in bin/dev/*.pid, each with SIGTERM, a bounded wait, then SIGKILL.
# Safe to rerun; with nothing running it does nothing. The order:
#
#   1. the MCP server, so that no agent creates Sandboxes meanwhile (it
#      deletes its own on the way out);
#   2. every remaining Sandbox: the control plane keeps no state across
#      restarts, so they are deleted while their managers still run, which
#      removes their Docker containers instead of leaving them behind
#      (deletes do not need the quota webhook);
#   3. the managers and the operator's webhook / aggregated API server;
#   4. the control plane.
set -euo pipefail

log() { echo "dev-down: $*" >&2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

DEV_DIR="bin/dev"
KUBECONFIG_PATH="${DEV_DIR}/kubeconfig"
STOP_TIMEOUT="${DEV_DOWN_TIMEOUT:-30}"
DELETE_TIMEOUT="${DEV_DOWN_DELETE_TIMEOUT:-30}"
KUBECTL="${KUBECTL:-kubectl}"

# A pid file is only trusted while its process still runs one of our
# binaries; pids are recycled, and we must never signal a stranger.
ours() {
  local pid=$1 cmdline
  cmdline=$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null) || return 1
  [[ "${cmdline}" == *devcluster* || "${cmdline}" == *manager* || "${cmdline}" == *code-sandbox-mcp* ]]
}

alive() { kill -0 "$1" 2>/dev/null; }

# stop_pid PID NAME: SIGTERM, wait up to STOP_TIMEOUT, then SIGKILL.
stop_pid() {
  local pid=$1 name=$2 children
  # devcluster runs etcd and kube-apiserver in their own process groups;
  # remember them so that a SIGKILLed devcluster does not orphan them.
  children=$(pgrep -P "${pid}" 2>/dev/null || true)
  log "stopping ${name} (pid ${pid})"
  kill -TERM "${pid}" 2>/dev/null || return 0
  local deadline=$((SECONDS + STOP_TIMEOUT))
  while alive "${pid}"; do
    if ((SECONDS >= deadline)); then
      log "${name} (pid ${pid}) did not exit within ${STOP_TIMEOUT}s; killing it"
      kill -KILL "${pid}" 2>/dev/null || true
      local child
      for child in ${children}; do
        kill -KILL "${child}" 2>/dev/null || true
      done
      break
    fi
    sleep 0.5
  done
}

# stop_file FILE: stops the process FILE records, if it is still ours.
stop_file() {
  local f=$1 name pid
  name=$(basename "${f}" .pid)
  pid=$(<"${f}")
  if [[ "${pid}" =~ ^[0-9]+$ ]] && alive "${pid}" && ours "${pid}"; then
    stop_pid "${pid}" "${name}"
  else
    log "${name} is not running"
  fi
  rm -f "${f}"
}

# remove_bookkeeping: devcluster removes its kubeconfig on a clean stop, but
# not when killed. The rest is dev-up-system's and make run's bookkeeping
# for what was stopped: the node managers' kubeconfigs and their Pod-bound
# tokens (for a control plane that is gone), health addresses, the cluster
# stamp, and the client CA file that earlier versions wrote.
remove_bookkeeping() {
  rm -f "${DEV_DIR}/kubeconfig" "${DEV_DIR}"/*.health "${DEV_DIR}/system.cluster" \
    "${DEV_DIR}"/manager-*.kubeconfig "${DEV_DIR}"/manager-*.kubeconfig.token "${DEV_DIR}/client-ca.crt"
}

shopt -s nullglob
pid_files=()
# Managers and the webhook go before the control plane so that they do not
# spend their last seconds failing to reach one that is already gone.
for f in "${DEV_DIR}"/*.pid; do
  case "$(basename "${f}")" in
  devcluster.pid | mcp.pid) ;;
  *) pid_files+=("${f}") ;;
  esac
done

if ((${#pid_files[@]} == 0)) && [[ ! -e "${DEV_DIR}/mcp.pid" && ! -e "${DEV_DIR}/devcluster.pid" ]]; then
  log "nothing to stop"
  # A kubeconfig without a control plane would make dev-up-system think
  # one runs.
  [[ -e "${DEV_DIR}/kubeconfig" ]] && ! timeout 5 "${KUBECTL}" --kubeconfig "${DEV_DIR}/kubeconfig" version >/dev/null 2>&1 && remove_bookkeeping
  exit 0
fi

[[ -e "${DEV_DIR}/mcp.pid" ]] && stop_file "${DEV_DIR}/mcp.pid"

# Bounded: a Sandbox whose manager is gone keeps its finalizer forever.
if [[ -s "${KUBECONFIG_PATH}" ]] &&
  sandboxes=$(timeout 10 "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" get sandboxes -A -o name 2>/dev/null) &&
  [[ -n "${sandboxes}" ]]; then
  log "deleting $(wc -l <<<"${sandboxes}") Sandbox(es) so that their managers remove the containers"
  if ! timeout $((DELETE_TIMEOUT + 10)) "${KUBECTL}" --kubeconfig "${KUBECONFIG_PATH}" delete sandboxes --all -A \
    --wait --timeout="${DELETE_TIMEOUT}s" >/dev/null; then
    log "not every Sandbox was deleted within ${DELETE_TIMEOUT}s (is its manager running?); its container may be left."
    log "list them with: docker ps --filter label=sandbox.code-sandbox.dev/managed-by=code-sandbox-operator"
  fi
fi

for f in "${pid_files[@]}"; do
  stop_file "${f}"
done
[[ -e "${DEV_DIR}/devcluster.pid" ]] && stop_file "${DEV_DIR}/devcluster.pid"

remove_bookkeeping
log "done"
