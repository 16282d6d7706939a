#!/usr/bin/env bash
# Stops what make dev-up started: every process recorded in bin/dev/*.pid
# (managers first, then the control plane), each with SIGTERM, a bounded
# wait, then SIGKILL. Safe to rerun; with nothing running it does nothing.
set -euo pipefail

log() { echo "dev-down: $*" >&2; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${ROOT}"

DEV_DIR="bin/dev"
STOP_TIMEOUT="${DEV_DOWN_TIMEOUT:-30}"

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
