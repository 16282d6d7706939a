#!/usr/bin/env bash
# Builds a kind node image with no registry (make kind-image) and prints its
# reference on stdout; progress and the time of each step go to stderr.
#
#   hack/kind/node-image.sh              build unless the tag exists
#   hack/kind/node-image.sh --print-ref  only print the reference
#   hack/kind/node-image.sh --go-bins    only build and cache etcd, crictl
#                                        and CoreDNS (no root, no Docker;
#                                        e.g. in the background while
#                                        something else holds Docker)
#   hack/kind/node-image.sh --debian-base  only build and cache the Debian
#                                        root filesystem image (root)
#
# What `kind build node-image` and kind's images/base do, from parts built
# on this machine (docs/cluster.md#make-the-cluster):
#   - a Debian bookworm root filesystem from debootstrap (systemd, iptables,
#     runc and the CNI plugins from Debian), cached as a Docker image that
#     is also the base of the kube-proxy image;
#   - kind's images/base/files of KIND_VERSION (entrypoint, containerd and
#     kubelet units, containerd config), from kind's Go module;
#   - kubeadm, kubelet, kubectl, the control-plane binaries, containerd and
#     ctr from hack/setup-cluster-bins.sh (one cached build per version);
#   - etcd, crictl and CoreDNS from their Go modules and pause from
#     hack/clusterpause, cached per version under
#     ~/.cache/code-sandbox-operator/kind/bin/;
#   - the control-plane images (FROM scratch, kube-proxy on the Debian
#     base) under the exact names kubeadm asks for, imported into the
#     node's containerd before the image is committed, so nothing is
#     pulled;
#   - simple-cni (node-files/) instead of kindnetd: the node image carries
#     the label dev.code-sandbox.kind.cni=simple-cni, and hack/kind/up.sh
#     disables kind's default CNI for images with that label.
# The tag holds the versions and a hash of the build inputs (this script,
# node-files/, hack/clusterpause, the versions), so a changed input builds
# a new image and an unchanged one is not rebuilt.
#
# Needs root (debootstrap, chroot, a private containerd), Docker, Go and
# Debian's mirror (apt's, or DEBIAN_MIRROR).
set -euo pipefail

cd "$(dirname "$0")/../.."
REPO=$PWD
HERE=${REPO}/hack/kind
FILES=${HERE}/node-files

K8S_VERSION=${K8S_VERSION:-1.37.1}
KIND_VERSION=${KIND_VERSION:-v0.33.0}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-2.2.0}
ETCD_VERSION=${KIND_ETCD_VERSION:-3.7.0}
COREDNS_VERSION=${KIND_COREDNS_VERSION:-1.14.7}
COREDNS_TAG=${KIND_COREDNS_TAG:-v1.14.6}
PAUSE_TAG=${KIND_PAUSE_TAG:-3.10.2}
CRICTL_VERSION=${KIND_CRICTL_VERSION:-1.34.0}
NODE_REPO=${KIND_NODE_REPO:-code-sandbox-kind/node}
CACHE_ROOT=${CODE_SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/code-sandbox-operator}
KIND_BIN_DIR=${CACHE_ROOT}/kind/bin
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log() { echo "kind-image: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

versions="k8s=${K8S_VERSION} kind=${KIND_VERSION} containerd=${CONTAINERD_VERSION} etcd=${ETCD_VERSION} coredns=${COREDNS_VERSION}/${COREDNS_TAG} pause=${PAUSE_TAG} crictl=${CRICTL_VERSION}"
# The build inputs, in a stable order.
input_hash=$(
  {
    echo "${versions}"
    for f in "${HERE}/node-image.sh" "${FILES}"/* "${REPO}/hack/clusterpause/main.go"; do
      echo "== ${f#"${REPO}"/} $(stat -c %a "$f")"
      cat "$f"
    done
  } | sha256sum | cut -c1-12
)
NODE_IMAGE="${NODE_REPO}:v${K8S_VERSION}-kind${KIND_VERSION#v}-ctrd${CONTAINERD_VERSION}-etcd${ETCD_VERSION}-dns${COREDNS_VERSION}-${input_hash}"

if [[ ${1:-} == --print-ref ]]; then
  echo "${NODE_IMAGE}"
  exit 0
fi
go_bins_only=""
base_only=""
case "${1:-}" in
  "") ;;
  --go-bins) go_bins_only=1 ;;
  --debian-base) base_only=1 ;;
  *) die "usage: $0 [--print-ref | --go-bins | --debian-base]" ;;
esac

if [[ -z ${go_bins_only}${base_only} ]] && docker image inspect "${NODE_IMAGE}" >/dev/null 2>&1; then
  log "${NODE_IMAGE} exists (same versions and inputs); nothing to build"
  echo "${NODE_IMAGE}"
  exit 0
fi
[[ -n ${go_bins_only} || $(id -u) -eq 0 ]] || die "building the node image needs root (debootstrap, chroot, a private containerd); the image ${NODE_IMAGE} does not exist yet"
[[ -n ${go_bins_only} ]] || docker info >/dev/null 2>&1 || die "no Docker Engine (make docker-up)"

if [[ -n ${go_bins_only} ]]; then
  log "building etcd, crictl and CoreDNS (${versions})"
else
  log "building ${NODE_IMAGE} (${versions})"
fi
work=$(mktemp -d /var/tmp/kind-image.XXXXXX)
ctrd_pid=""
cleanup() {
  if [[ -n ${ctrd_pid} ]]; then
    kill "${ctrd_pid}" 2>/dev/null || true
    wait "${ctrd_pid}" 2>/dev/null || true
  fi
  rm -rf "${work}"
}
trap cleanup EXIT
R=${work}/rootfs
mkdir -p "${KIND_BIN_DIR}" "${work}/build"

# step NAME CMD...: runs a build step and reports its time.
step() {
  local name=$1 start=${SECONDS}
  shift
  "$@"
  log "TIMING ${name}: $((SECONDS - start))s"
}

# gomod DIR: a throwaway module for building a command from its Go module
# (main.go from stdin); leaves the shell in DIR.
gomod() {
  mkdir -p "${work}/build/$1"
  cd "${work}/build/$1"
  printf 'module %s\n\ngo 1.26\n' "$1" >go.mod
  cat >main.go
}
gobuild() { CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath "$@" >&2; }

cluster_bins() {
  BIN=$(CLUSTER_K8S_VERSION="${K8S_VERSION}" CONTAINERD_VERSION="${CONTAINERD_VERSION}" hack/setup-cluster-bins.sh)
}

etcd_bin() {
  ETCD=${KIND_BIN_DIR}/etcd-v${ETCD_VERSION}
  [[ -x ${ETCD} ]] && return
  log "building etcd v${ETCD_VERSION} (Debian's 3.4 lacks what kubeadm ${K8S_VERSION} probes)"
  gomod etcd <<<$'package main\n\nimport _ "go.etcd.io/etcd/server/v3/etcdmain"\n\nfunc main() {}'
  GOFLAGS=-mod=mod go get "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >&2
  GOFLAGS=-mod=mod go mod tidy >&2
  gobuild -ldflags "-s -w" -o "${ETCD}.tmp" go.etcd.io/etcd/server/v3
  mv "${ETCD}.tmp" "${ETCD}"
  cd "${REPO}"
}

crictl_bin() {
  CRICTL=${KIND_BIN_DIR}/crictl-v${CRICTL_VERSION}
  [[ -x ${CRICTL} ]] && return
  log "building crictl v${CRICTL_VERSION} (kind export logs uses it)"
  gomod crictl <<<$'package main\n\nimport _ "sigs.k8s.io/cri-tools/cmd/crictl"\n\nfunc main() {}'
  GOFLAGS=-mod=mod go get "sigs.k8s.io/cri-tools@v${CRICTL_VERSION}" >&2
  GOFLAGS=-mod=mod go mod tidy >&2
  gobuild -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=v${CRICTL_VERSION}" -o "${CRICTL}.tmp" sigs.k8s.io/cri-tools/cmd/crictl
  mv "${CRICTL}.tmp" "${CRICTL}"
  cd "${REPO}"
}

# kubeadm's Corefile needs prometheus and loadbalance besides the plugins
# the single-node cluster's CoreDNS (hack/setup-cluster-bins.sh) has.
coredns_bin() {
  COREDNS=${KIND_BIN_DIR}/coredns-kubeadm-v${COREDNS_VERSION}
  [[ -x ${COREDNS} ]] && return
  log "building CoreDNS v${COREDNS_VERSION} with the plugins of kubeadm's Corefile"
  gomod coredns <<'GO'
// A CoreDNS with the plugins of kubeadm's Corefile.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func init() {
	dnsserver.Directives = []string{"reload", "ready", "health", "prometheus", "errors", "loadbalance", "cache", "kubernetes", "loop", "forward"}
}

func main() { coremain.Run() }
GO
  GOFLAGS=-mod=mod go get "github.com/coredns/coredns@v${COREDNS_VERSION}" >&2
  GOFLAGS=-mod=mod go mod tidy >&2
  gobuild -ldflags "-s -w" -o "${COREDNS}.tmp" .
  mv "${COREDNS}.tmp" "${COREDNS}"
  cd "${REPO}"
}

pause_bin() {
  PAUSE=${work}/pause
  gobuild -ldflags "-s -w" -o "${PAUSE}" ./hack/clusterpause
}

kind_files() {
  GOFLAGS=-mod=mod go mod download "sigs.k8s.io/kind@${KIND_VERSION}" >&2
  KIND_FILES=$(go env GOMODCACHE)/sigs.k8s.io/kind@${KIND_VERSION}/images/base/files
  [[ -d ${KIND_FILES} ]] || die "kind ${KIND_VERSION} has no images/base/files"
}

# The images kubeadm will ask for must be exactly the ones built here.
check_kubeadm_images() {
  local want got
  want=$(printf '%s\n' "registry.k8s.io/kube-apiserver:v${K8S_VERSION}" \
    "registry.k8s.io/kube-controller-manager:v${K8S_VERSION}" "registry.k8s.io/kube-scheduler:v${K8S_VERSION}" \
    "registry.k8s.io/kube-proxy:v${K8S_VERSION}" "registry.k8s.io/coredns/coredns:${COREDNS_TAG}" \
    "registry.k8s.io/pause:${PAUSE_TAG}" "registry.k8s.io/etcd:${ETCD_VERSION}-0" | sort)
  got=$("${BIN}/kubeadm" config images list --kubernetes-version "v${K8S_VERSION}" 2>/dev/null | sort)
  [[ ${want} == "${got}" ]] || die "kubeadm v${K8S_VERSION} asks for other images than the pinned tags (KIND_ETCD_VERSION, KIND_COREDNS_TAG, KIND_PAUSE_TAG in the Makefile):
$(diff <(echo "${want}") <(echo "${got}") || true)"
}

# The Debian root filesystem, cached as a Docker image keyed by the
# package list: debootstrap runs once per list, not once per node image.
DEB_PACKAGES=systemd,systemd-sysv,iptables,nftables,iproute2,conntrack,ethtool,util-linux,mount,kmod,procps,ca-certificates,libseccomp2,runc,containernetworking-plugins,pigz,bash,jq
rootfs() {
  DEB_IMAGE=code-sandbox-kind/debian:bookworm-$(sha256sum <<<"${DEB_PACKAGES}" | cut -c1-12)
  mkdir -p "${R}"
  if docker image inspect "${DEB_IMAGE}" >/dev/null 2>&1; then
    log "root filesystem from ${DEB_IMAGE}"
    local c
    c=$(docker create "${DEB_IMAGE}" /bin/true)
    docker export "${c}" | tar -C "${R}" -x
    docker rm "${c}" >/dev/null
    # Docker's own mount points, empty in the export.
    rm -f "${R}/.dockerenv"
    return
  fi
  command -v debootstrap >/dev/null || {
    log "installing debootstrap (apt)"
    apt-get install -y --no-install-recommends debootstrap >&2
  }
  local mirror=${DEBIAN_MIRROR:-}
  if [[ -z ${mirror} ]]; then
    mirror=$(grep -h -m1 '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2; exit}')
  fi
  if [[ -z ${mirror} ]]; then
    mirror=$(awk '$1 == "deb" {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  fi
  mirror=${mirror:-http://deb.debian.org/debian}
  log "debootstrap bookworm from ${mirror}"
  # No dbus: its unit sets OOMScoreAdjust=-900, which VMs that forbid
  # lowering oom_score_adj refuse.
  if ! debootstrap --variant=minbase --include="${DEB_PACKAGES}" bookworm "${R}" "${mirror}" >"${work}/debootstrap.log" 2>&1; then
    tail -n 30 "${work}/debootstrap.log" >&2
    die "debootstrap failed (log above)"
  fi
  rm -rf "${R}"/var/cache/apt/archives/*.deb "${R}"/var/lib/apt/lists/* "${R}"/usr/share/{doc,man,locale}/* "${R}"/var/log/*
  tar -C "${R}" -c . | docker import -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "${DEB_IMAGE}" >/dev/null
}

# The control-plane images, under the names kubeadm asks for, saved to one
# archive for the node's containerd. They are tagged in the host's Docker
# only while they are saved.
IMAGES=()
component_images() {
  local ctx=${work}/images
  mk() { # name tag binary base dest [extra Dockerfile lines]
    local d=${ctx}/$1
    mkdir -p "$d"
    cp "$3" "$d/"
    {
      echo "FROM $4"
      echo "COPY $(basename "$3") $5"
      echo 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
      if [[ -n ${6:-} ]]; then echo "$6"; fi
    } >"$d/Dockerfile"
    DOCKER_BUILDKIT=0 docker build -q -t "$2" "$d" >/dev/null
    IMAGES+=("$2")
  }
  mk apiserver "registry.k8s.io/kube-apiserver:v${K8S_VERSION}" "${BIN}/kube-apiserver" scratch /usr/local/bin/
  mk kcm "registry.k8s.io/kube-controller-manager:v${K8S_VERSION}" "${BIN}/kube-controller-manager" scratch /usr/local/bin/
  mk scheduler "registry.k8s.io/kube-scheduler:v${K8S_VERSION}" "${BIN}/kube-scheduler" scratch /usr/local/bin/
  mk proxy "registry.k8s.io/kube-proxy:v${K8S_VERSION}" "${BIN}/kube-proxy" "${DEB_IMAGE}" /usr/local/bin/
  mk etcd "registry.k8s.io/etcd:${ETCD_VERSION}-0" "${ETCD}" scratch /usr/local/bin/etcd
  mk coredns "registry.k8s.io/coredns/coredns:${COREDNS_TAG}" "${COREDNS}" scratch /coredns 'ENTRYPOINT ["/coredns"]'
  mk pause "registry.k8s.io/pause:${PAUSE_TAG}" "${PAUSE}" scratch /pause $'USER 65535:65535\nENTRYPOINT ["/pause"]'
  docker save -o "${work}/images.tar" "${IMAGES[@]}"
  docker rmi "${IMAGES[@]}" >/dev/null
}

# What kind's images/base/Dockerfile and `kind build node-image` do.
assemble() {
  local K=${KIND_FILES}
  install -m 0755 "$K"/usr/local/bin/* "${R}/usr/local/bin/"
  mkdir -p "${R}/kind/bin" "${R}/kind/manifests" "${R}/etc/containerd" "${R}/etc/default" "${R}/etc/sysctl.d" \
    "${R}/etc/systemd/system/kubelet.service.d" "${R}/etc/kubernetes/manifests" "${R}/opt/cni/bin" "${R}/etc/cni/net.d"
  cp -r "$K"/kind/. "${R}/kind/"
  chmod 0644 "${R}/kind/README.txt"
  chmod 0755 "${R}/kind/bin" "${R}"/kind/bin/*
  install -m 0644 "$K/etc/crictl.yaml" "${R}/etc/"
  install -m 0644 "$K/etc/containerd/config.toml" "${R}/etc/containerd/"
  install -m 0644 "$K/etc/default/kubelet" "${R}/etc/default/"
  install -m 0644 "$K"/etc/sysctl.d/* "${R}/etc/sysctl.d/"
  install -m 0644 "$K"/etc/systemd/system/*.service "$K"/etc/systemd/system/*.slice "${R}/etc/systemd/system/"
  install -m 0644 "$K"/etc/systemd/system/kubelet.service.d/* "${R}/etc/systemd/system/kubelet.service.d/"
  # kind's base: only the units a node needs start.
  find "${R}/lib/systemd/system/sysinit.target.wants/" -name systemd-tmpfiles-setup.service -delete
  rm -f "${R}"/lib/systemd/system/multi-user.target.wants/* "${R}"/etc/systemd/system/*.wants/* \
    "${R}"/lib/systemd/system/local-fs.target.wants/* "${R}"/lib/systemd/system/sockets.target.wants/*udev* \
    "${R}"/lib/systemd/system/sockets.target.wants/*initctl* "${R}"/lib/systemd/system/basic.target.wants/*
  echo "ReadKMsg=no" >>"${R}/etc/systemd/journald.conf"
  # VMs that forbid lowering oom_score_adj: containerd must not try (every
  # pod sandbox fails otherwise), and its unit must not ask for it.
  sed -i '/^OOMScoreAdjust=/d' "${R}/etc/systemd/system/containerd.service"
  grep -q 'restrict_oom_score_adj = false' "${R}/etc/containerd/config.toml" ||
    die "kind ${KIND_VERSION}'s containerd config has no 'restrict_oom_score_adj = false' to flip"
  sed -i -e 's/restrict_oom_score_adj = false/restrict_oom_score_adj = true/' \
    -e "s#sandbox_image = \"registry.k8s.io/pause:[^\"]*\"#sandbox_image = \"registry.k8s.io/pause:${PAUSE_TAG}\"#" \
    "${R}/etc/containerd/config.toml"
  grep -q "registry.k8s.io/pause:${PAUSE_TAG}" "${R}/etc/containerd/config.toml" ||
    die "kind ${KIND_VERSION}'s containerd config names no sandbox image to pin to pause:${PAUSE_TAG}"
  install -m 0755 "${BIN}/containerd" "${BIN}/containerd-shim-runc-v2" "${BIN}/ctr" "${FILES}/entrypoint-vm" "${R}/usr/local/bin/"
  install -m 0755 "${CRICTL}" "${R}/usr/local/bin/crictl"
  install -m 0755 "${BIN}/kubeadm" "${BIN}/kubelet" "${BIN}/kubectl" "${R}/usr/bin/"
  cp "${R}"/usr/lib/cni/{host-local,loopback,ptp,portmap,bridge} "${R}/opt/cni/bin/"
  # containerd's default spec, with kind's hook, and no rlimits (the VM
  # refuses to raise RLIMIT_NOFILE above its own limit).
  chroot "${R}" ctr oci spec |
    jq '.hooks.createContainer[.hooks.createContainer | length] |= . + {"path": "/kind/bin/mount-product-files.sh"}' |
    jq 'del(.process.rlimits)' >"${R}/etc/containerd/cri-base.json"
  echo "v${K8S_VERSION}" >"${R}/kind/version"
  # kindnetd's stand-in.
  install -m 0755 "${FILES}/simple-cni.sh" "${R}/kind/bin/"
  install -m 0644 "${FILES}/simple-cni-rbac.yaml" "${R}/kind/manifests/"
  install -m 0644 "${FILES}/simple-cni.service" "${R}/etc/systemd/system/"
  # Paused sandboxes would keep a stopping node from ever exiting.
  install -m 0755 "${FILES}/thaw-on-shutdown.sh" "${R}/kind/bin/"
  install -m 0644 "${FILES}/thaw-on-shutdown.service" "${R}/etc/systemd/system/"
  chroot "${R}" systemctl enable kubelet.service containerd.service undo-mount-hacks.service simple-cni.service thaw-on-shutdown.service >&2
  chroot "${R}" systemctl mask systemd-binfmt.service >&2
  : >"${R}/etc/machine-id"
}

# Into the node's containerd content store, with a private containerd on
# the host whose root is the node's /var/lib/containerd.
preload_images() {
  mkdir -p "${work}/ctrd-state"
  cat >"${work}/ctrd.toml" <<EOF
version = 3
root = "${R}/var/lib/containerd"
state = "${work}/ctrd-state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.nri.v1.nri", "io.containerd.podsandbox.controller.v1.podsandbox", "io.containerd.sandbox.controller.v1.shim"]
[grpc]
  address = "${work}/ctrd.sock"
[ttrpc]
  address = "${work}/ctrd.sock.ttrpc"
EOF
  "${BIN}/containerd" --config "${work}/ctrd.toml" >"${work}/ctrd.log" 2>&1 &
  ctrd_pid=$!
  local i
  for i in $(seq 100); do
    [[ -S ${work}/ctrd.sock ]] && break
    sleep 0.2
  done
  [[ -S ${work}/ctrd.sock ]] || {
    cat "${work}/ctrd.log" >&2
    die "the private containerd did not start"
  }
  "${BIN}/ctr" -a "${work}/ctrd.sock" -n k8s.io images import --all-platforms --no-unpack --digests \
    --label io.cri-containerd.pinned=pinned "${work}/images.tar" >/dev/null
  local have
  have=$("${BIN}/ctr" -a "${work}/ctrd.sock" -n k8s.io images ls -q)
  for i in "${IMAGES[@]}"; do
    grep -qx "$i" <<<"${have}" || die "image $i is not in the node's containerd after the import"
  done
  kill "${ctrd_pid}"
  wait "${ctrd_pid}" || true
  ctrd_pid=""
  rm -rf "${R}"/var/lib/containerd/{io.containerd.grpc.v1.introspection,tmpmounts,io.containerd.runtime.v2.task} "${work}/images.tar"
}

node_image() {
  local nostop=${NODE_IMAGE}-nostop
  tar -C "${R}" -c . | docker import -c 'ENV container=docker' \
    -c 'ENTRYPOINT ["/usr/local/bin/entrypoint-vm","/sbin/init"]' - "${nostop}" >/dev/null
  # Docker 20.10's import refuses STOPSIGNAL, and LABEL is added here too.
  printf 'FROM %s\nSTOPSIGNAL SIGRTMIN+3\nLABEL dev.code-sandbox.kind.cni=simple-cni dev.code-sandbox.kind.versions="%s"\n' \
    "${nostop}" "${versions}" | DOCKER_BUILDKIT=0 docker build -q -t "${NODE_IMAGE}" - >/dev/null
  docker rmi "${nostop}" >/dev/null
}

total=${SECONDS}
if [[ -n ${go_bins_only} ]]; then
  step etcd etcd_bin
  step crictl crictl_bin
  step coredns coredns_bin
  exit 0
fi
if [[ -n ${base_only} ]]; then
  step debootstrap rootfs
  log "Debian base: ${DEB_IMAGE}"
  exit 0
fi
step setup-cluster-bins cluster_bins
step kubeadm-images check_kubeadm_images
step etcd etcd_bin
step crictl crictl_bin
step coredns coredns_bin
step pause pause_bin
step kind-base-files kind_files
step debootstrap rootfs
step component-images component_images
step assemble assemble
step preload-images preload_images
step node-image node_image
log "TIMING total: $((SECONDS - total))s; built ${NODE_IMAGE}"
echo "${NODE_IMAGE}"
