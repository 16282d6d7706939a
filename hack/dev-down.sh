#!/usr/bin/env bash
# Stops what make dev-up started: every process recorded in bin/dev/*.pid
# (managers first, then the control plane), each with SIGTERM, a bounded
# wait, then SIGKILL. Safe to rerun; with nothing running it does nothing.
#
# The control plane keeps no state across restarts, so its Sandboxes are
# deleted first: while their managers still run, that removes their Docker
# containers instead of leaving them behind.
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
  [[ "${cmdline}" == *devcluster* || "${cmdline}" == *manager* ]]
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

shopt -s nullglob
pid_files=()
# Managers go first so that they do not spend their last seconds failing to
# reach a control plane that is already gone.
for f in "${DEV_DIR}"/*.pid; do
  [[ "$(basename "${f}")" == devcluster.pid ]] || pid_files+=("${f}")
done
[[ -e "${DEV_DIR}/devcluster.pid" ]] && pid_files+=("${DEV_DIR}/devcluster.pid")

if ((${#pid_files[@]} == 0)); then
  log "nothing to stop"
  exit 0
fi

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
  name=$(basename "${f}" .pid)
  pid=$(<"${f}")
  if [[ "${pid}" =~ ^[0-9]+$ ]] && alive "${pid}" && ours "${pid}"; then
    stop_pid "${pid}" "${name}"
  else
    log "${name} is not running"
  fi
  rm -f "${f}"
done

# devcluster removes its kubeconfig on a clean stop, but not when killed.
rm -f "${DEV_DIR}/kubeconfig"
log "done"
