#!/usr/bin/env bash
# Builds the in-cluster snapshot registry image for kind
# (config/components/snapshot-registry) offline: Debian's docker-registry
# (Docker Distribution 2.8, the registry the snapshotstore tests run) with
# the two C libraries it links (libc and the dynamic loader), FROM scratch.
# No registry image can be pulled here, and this binary is the one already
# tested against; it needs no build.
#
# The tag hashes the inputs (this script and the binary), so an image built
# from the same inputs is left alone; the Makefile computes the same tag
# (SNAPSHOT_REGISTRY_IMG).
#
# Usage: hack/build-snapshot-registry-image.sh [IMAGE]
# Needs Docker and docker-registry (apt-get install docker-registry; as root
# it is installed when missing).
set -euo pipefail

log() { echo "build-snapshot-registry-image: $*" >&2; }

cd "$(dirname "$0")/.."
bin=/usr/bin/docker-registry
if [[ ! -x ${bin} ]]; then
  [[ $(id -u) -eq 0 ]] || { log "docker-registry is not installed (apt-get install docker-registry)"; exit 1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-registry >&2
  # The package starts a registry on :5000; this script wants the binary only.
  systemctl disable --now docker-registry >/dev/null 2>&1 || true
fi

inputs_hash() {
  cat hack/build-snapshot-registry-image.sh "${bin}" | sha256sum | cut -c1-12
}
HASH=$(inputs_hash)
IMAGE="${1:-code-sandbox-operator/snapshot-registry:${HASH}}"
label=code-sandbox-operator.snapshot-registry-inputs

if [[ "$(docker image inspect -f "{{ index .Config.Labels \"${label}\" }}" "${IMAGE}" 2>/dev/null)" == "${HASH}" ]]; then
  log "${IMAGE} is up to date"
  exit 0
fi

ctx=$(mktemp -d)
trap 'rm -rf "${ctx}"' EXIT
mkdir -p "${ctx}/root/usr/bin" "${ctx}/root/var/lib/registry" "${ctx}/root/tmp"
cp "${bin}" "${ctx}/root/usr/bin/docker-registry"
# Every shared object the binary needs, at the path it is linked against.
while read -r lib; do
  mkdir -p "${ctx}/root$(dirname "${lib}")"
  cp -L "${lib}" "${ctx}/root${lib}"
done < <(ldd "${bin}" | grep -o '/[^ ]*')
chmod 1777 "${ctx}/root/tmp"
cat >"${ctx}/Dockerfile" <<DOCKERFILE
FROM scratch
COPY root/ /
LABEL ${label}=${HASH}
USER 65532:65532
EXPOSE 5000
ENTRYPOINT ["/usr/bin/docker-registry"]
CMD ["serve", "/etc/docker-registry/config.yml"]
DOCKERFILE
docker build -q -t "${IMAGE}" "${ctx}" >&2
# It runs: the loader and libc are all it needs.
docker run --rm --network none "${IMAGE}" --version >&2
log "built ${IMAGE}"
