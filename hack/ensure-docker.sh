#!/usr/bin/env bash
# Makes sure a Docker Engine is installed and answering on /var/run/docker.sock.
# On a fresh Debian machine it installs docker.io (and runsc for gVisor tests),
# registers the runsc runtime and starts dockerd in the background.
set -euo pipefail

log() { echo "ensure-docker: $*" >&2; }

SOCK="${DOCKER_SOCK:-/var/run/docker.sock}"
LOG_FILE="${DOCKERD_LOG:-/var/log/code-sandbox-dockerd.log}"

docker_answers() { timeout 10 docker -H "unix://${SOCK}" version >/dev/null 2>&1; }

if docker_answers; then
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  log "Docker is not answering on ${SOCK} and installing it needs root; start Docker or rerun as root"
  exit 1
fi

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "$@" >&2 || { apt-get update >&2 && apt-get install -y --no-install-recommends "$@" >&2; }
}

if ! command -v dockerd >/dev/null 2>&1; then
  log "installing Debian's docker.io"
  apt_install docker.io iptables
fi
if ! command -v runsc >/dev/null 2>&1; then
  # gVisor is optional: its tests skip when it is missing.
  apt_install runsc || log "runsc is not installable; gVisor tests will be skipped"
fi

mkdir -p /etc/docker
if [[ ! -f /etc/docker/daemon.json ]] && command -v runsc >/dev/null 2>&1; then
  # ptrace works without KVM; gVisor's netstack is off because sandboxes run
  # with network mode none.
  cat > /etc/docker/daemon.json <<JSON
{
  "runtimes": {
    "runsc": {
      "path": "$(command -v runsc)",
      "runtimeArgs": ["--platform=ptrace", "--network=none"]
    }
  }
}
JSON
fi

if pgrep -x dockerd >/dev/null 2>&1; then
  log "dockerd is running but not answering yet; waiting"
else
  log "starting dockerd (log: ${LOG_FILE})"
  (systemctl start docker >/dev/null 2>&1 || service docker start >/dev/null 2>&1) || true
  if ! pgrep -x dockerd >/dev/null 2>&1; then
    nohup dockerd >"${LOG_FILE}" 2>&1 </dev/null &
  fi
fi

for _ in $(seq 1 60); do
  if docker_answers; then
    log "Docker is up"
    exit 0
  fi
  sleep 1
done
log "dockerd did not answer within 60s; see ${LOG_FILE}"
tail -n 30 "${LOG_FILE}" >&2 || true
exit 1
