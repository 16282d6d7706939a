#!/usr/bin/env bash
# Builds the images the tests use without any registry:
#   code-sandbox-test/busybox:1  - busybox-static on scratch (tiny, fast to start)
#   code-sandbox-test/python:3   - Debian bookworm minbase + python3 (debootstrap)
# An image that already exists under its tag is left alone. The python root
# filesystem tarball is cached per user so that a fresh Docker daemon on the
# same machine imports it in seconds.
set -euo pipefail

log() { echo "build-test-images: $*" >&2; }

BUSYBOX_IMAGE="${BUSYBOX_IMAGE:-code-sandbox-test/busybox:1}"
PYTHON_IMAGE="${PYTHON_IMAGE:-code-sandbox-test/python:3}"
CACHE_ROOT="${CODE_SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/code-sandbox-operator}"
SUITE="${DEBIAN_SUITE:-bookworm}"

apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends "$@" >&2 || { apt-get update >&2 && apt-get install -y --no-install-recommends "$@" >&2; }
}

# Bump when the images' content changes, so that cached images are rebuilt.
IMAGES_REVISION=2

image_exists() {
  [[ "$(docker image inspect -f '{{ index .Config.Labels "code-sandbox-test.revision" }}' "$1" 2>/dev/null)" == "${IMAGES_REVISION}" ]]
}

build_busybox() {
  if image_exists "${BUSYBOX_IMAGE}"; then return; fi
  [[ -x /bin/busybox ]] || apt_install busybox-static
  if ! file -L /bin/busybox 2>/dev/null | grep -q 'statically linked'; then
    # A dynamically linked busybox would need libc in the image.
    apt_install busybox-static
  fi
  local ctx
  ctx=$(mktemp -d)
  mkdir -p "${ctx}/bin" "${ctx}/tmp" "${ctx}/etc"
  # runc gives a tmpfs the mode of the directory it covers, so /tmp must be
  # world-writable in the image for the sandbox user to use it.
  chmod 1777 "${ctx}/tmp"
  cp /bin/busybox "${ctx}/bin/busybox"
  echo 'root:x:0:0:root:/root:/bin/sh' > "${ctx}/etc/passwd"
  echo 'nobody:x:65534:65534:nobody:/nonexistent:/bin/sh' >> "${ctx}/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "${ctx}/etc/group"
  cat > "${ctx}/Dockerfile" <<DOCKERFILE
FROM scratch
LABEL code-sandbox-test.revision=${IMAGES_REVISION}
COPY . /
RUN ["/bin/busybox", "--install", "-s", "/bin"]
CMD ["/bin/sh"]
DOCKERFILE
  cat > "${ctx}/.dockerignore" <<'IGNORE'
Dockerfile
.dockerignore
IGNORE
  log "building ${BUSYBOX_IMAGE}"
  DOCKER_BUILDKIT=0 docker build -q -t "${BUSYBOX_IMAGE}" "${ctx}" >&2
  rm -rf "${ctx}"
}

build_python() {
  if image_exists "${PYTHON_IMAGE}"; then return; fi
  local tarball="${CACHE_ROOT}/images/python-${SUITE}.tar"
  if [[ ! -s "${tarball}" ]]; then
    command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap
    local root
    root=$(mktemp -d)
    local bootstrap_log="${CACHE_ROOT}/images/debootstrap.log"
    mkdir -p "$(dirname "${bootstrap_log}")"
    log "debootstrapping ${SUITE} with python3 (about a minute; log: ${bootstrap_log})"
    if ! debootstrap --variant=minbase --include=python3 "${SUITE}" "${root}" >"${bootstrap_log}" 2>&1; then
      tail -n 30 "${bootstrap_log}" >&2
      rm -rf "${root}"
      log "debootstrap failed"
      exit 1
    fi
    rm -rf "${root}/var/cache/apt/archives/"*.deb "${root}/var/lib/apt/lists/"*
    mkdir -p "$(dirname "${tarball}")"
    tar -C "${root}" -cf "${tarball}.tmp" .
    mv "${tarball}.tmp" "${tarball}"
    rm -rf "${root}"
  fi
  log "importing ${PYTHON_IMAGE}"
  docker import -c "LABEL code-sandbox-test.revision=${IMAGES_REVISION}" -c 'CMD ["/bin/bash"]' -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' "${tarball}" "${PYTHON_IMAGE}" >/dev/null
}

build_busybox
build_python
log "images ready: ${BUSYBOX_IMAGE} ${PYTHON_IMAGE}"
