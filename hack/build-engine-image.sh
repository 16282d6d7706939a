#!/usr/bin/env bash
# Builds the Engine image (config/engine) offline: a Debian minbase root
# filesystem made with debootstrap, with Debian's docker.io (dockerd, the
# docker CLI, containerd, runc, tini), iptables (both the nft and the legacy
# variants) and, where Debian has it, runsc (gVisor), then `docker import`.
# hack/engine/entrypoint.sh is the entrypoint, hack/engine/daemon.json the
# Engine's configuration (docs/deploy.md#the-engine-image).
#
# The tag hashes the inputs (this script and hack/engine/), so an image
# already built from the same inputs is left alone; the Makefile computes the
# same tag (ENGINE_IMG). The debootstrapped root filesystem is cached per
# user (keyed by the suite and the package list), so a fresh Docker daemon, or a changed
# entrypoint or daemon.json, takes seconds.
#
# Usage: hack/build-engine-image.sh [IMAGE, default code-sandbox-operator/engine:<inputs hash>]
# Needs root (debootstrap, installed with apt when missing) and Docker.
set -euo pipefail

log() { echo "build-engine-image: $*" >&2; }

cd "$(dirname "$0")/.."
SUITE="${DEBIAN_SUITE:-bookworm}"
CACHE_ROOT="${CODE_SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/code-sandbox-operator}"

inputs_hash() {
  cat hack/build-engine-image.sh hack/engine/entrypoint.sh hack/engine/daemon.json | sha256sum | cut -c1-12
}
HASH=$(inputs_hash)
IMAGE="${1:-code-sandbox-operator/engine:${HASH}}"

if [[ "$(docker image inspect -f '{{ index .Config.Labels "code-sandbox-operator.engine-inputs" }}' "${IMAGE}" 2>/dev/null)" == "${HASH}" ]]; then
  log "${IMAGE} is up to date"
  exit 0
fi

mirror() {
  if [[ -n "${DEBIAN_MIRROR:-}" ]]; then
    echo "${DEBIAN_MIRROR}"
    return
  fi
  local m
  m=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2; exit}')
  [[ -n "${m}" ]] || m=$(awk '$1 == "deb" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null)
  echo "${m:-http://deb.debian.org/debian}"
}

# What debootstrap installs; bump ROOTFS_REVISION when the root filesystem
# step below changes otherwise.
PACKAGES=docker.io,containerd,runc,tini,iptables,kmod,procps,ca-certificates
ROOTFS_REVISION=1
BASE_HASH=$(echo "${SUITE} ${PACKAGES} ${ROOTFS_REVISION}" | sha256sum | cut -c1-12)
tarball="${CACHE_ROOT}/engine/rootfs-${SUITE}-${BASE_HASH}.tar"
if [[ ! -s "${tarball}" ]]; then
  if ! command -v debootstrap >/dev/null; then
    [[ $(id -u) -eq 0 ]] || { log "debootstrap is not installed and installing it needs root"; exit 1; }
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends debootstrap >&2 || { apt-get update >&2 && apt-get install -y --no-install-recommends debootstrap >&2; }
  fi
  [[ $(id -u) -eq 0 ]] || { log "debootstrap needs root"; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "${work}"' EXIT
  R="${work}/rootfs"
  # runsc (gVisor) where the suite has it; bookworm does not.
  extra=""
  if apt-cache show runsc >/dev/null 2>&1; then extra=",runsc"; fi
  log "debootstrap ${SUITE} from $(mirror) (a minute or two)"
  if ! debootstrap --variant=minbase \
    --include="${PACKAGES}${extra}" \
    "${SUITE}" "${R}" "$(mirror)" >"${work}/debootstrap.log" 2>&1; then
    tail -n 30 "${work}/debootstrap.log" >&2
    log "debootstrap failed (log above)"
    exit 1
  fi
  # Small: no package lists, caches, documentation, locales or logs.
  rm -rf "${R}"/var/cache/apt/* "${R}"/var/lib/apt/lists/* "${R}"/usr/share/doc/* "${R}"/usr/share/man/* \
    "${R}"/usr/share/info/* "${R}"/usr/share/locale/* "${R}"/usr/share/lintian "${R}"/var/log/* "${R}"/tmp/*
  # Tools the Engine does not run: libnetwork's test client, the v1 shims.
  rm -f "${R}"/usr/bin/dnet "${R}"/usr/bin/containerd-shim "${R}"/usr/bin/containerd-shim-runc-v1
  # Debian's default Engine configuration is not ours (added below).
  rm -rf "${R}/etc/docker"
  mkdir -p "$(dirname "${tarball}")"
  tar -C "${R}" --numeric-owner -cf "${tarball}.tmp" .
  mv "${tarball}.tmp" "${tarball}"
  rm -rf "${work}"
  trap - EXIT
fi

# The entrypoint and the configuration, appended to a copy of the cached
# root filesystem (later tar members win).
stage=$(mktemp -d)
trap 'rm -rf "${stage}"' EXIT
mkdir -p "${stage}/etc/docker" "${stage}/usr/local/bin"
install -m 0755 hack/engine/entrypoint.sh "${stage}/usr/local/bin/code-sandbox-engine"
if tar -tf "${tarball}" ./usr/bin/runsc >/dev/null 2>&1; then
  # gVisor is registered only where the image has runsc; elsewhere the
  # manager reports RuntimeUnavailable for gvisor Sandboxes. As
  # hack/ensure-docker.sh registers it: ptrace works without KVM, and
  # gVisor's netstack is off (gvisor Sandboxes have network mode none).
  sed 's#^{#{\n  "runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--platform=ptrace", "--network=none"]}},#' hack/engine/daemon.json >"${stage}/etc/docker/daemon.json"
else
  install -m 0644 hack/engine/daemon.json "${stage}/etc/docker/daemon.json"
fi
cp "${tarball}" "${stage}/rootfs.tar"
tar -C "${stage}" --numeric-owner --owner=0 --group=0 -rf "${stage}/rootfs.tar" ./etc/docker ./usr/local/bin/code-sandbox-engine

log "importing ${IMAGE}"
docker import \
  -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  -c 'ENTRYPOINT ["/usr/bin/tini", "-s", "-g", "--", "/usr/local/bin/code-sandbox-engine"]' \
  -c "LABEL code-sandbox-operator.engine-inputs=${HASH}" \
  "${stage}/rootfs.tar" "${IMAGE}" >/dev/null
log "built ${IMAGE} ($(docker image inspect -f '{{ .Size }}' "${IMAGE}" | awk '{ printf "%d MB", $1 / 1000000 }'))"
