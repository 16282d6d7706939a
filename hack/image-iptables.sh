#!/usr/bin/env bash
# Stages the iptables the manager image ships (Dockerfile COPYs the result):
# Debian's xtables-nft-multi and xtables-legacy-multi with their symlinks
# (iptables-nft, iptables-nft-save, iptables-nft-restore, ip6tables-nft...,
# iptables-legacy..., ip6tables-legacy...), the xtables extension modules
# (-m conntrack, -p udp -m udp, ...), and exactly the shared libraries all
# of them load (ldd), the dynamic loader included, at the paths the loader
# looks in. The manager picks nft or legacy at run time
# (--egress-iptables-mode, internal/egress). No plain "iptables" is shipped:
# it could silently be the wrong backend.
#
# Offline and idempotent: it copies this host's files (installing Debian's
# iptables package first if it is missing, which needs root and apt), so the
# image is for the build host's architecture; the manager binary must be
# too (GOARCH, checked). The staging root is rebuilt on every run and
# replaced in one step.
#
# Usage: hack/image-iptables.sh [staging root, default bin/image/manager-root]
set -euo pipefail

log() { echo "image-iptables: $*" >&2; }

cd "$(dirname "$0")/.."
ROOT="${1:-bin/image/manager-root}"
GO="${GO:-go}"

# The image's architecture is the host's: the binaries come from its
# packages.
deb_arch=$(dpkg --print-architecture)
go_arch=$(GOTOOLCHAIN="${GOTOOLCHAIN:-local}" "${GO}" env GOARCH)
case "${deb_arch}" in
  amd64 | arm64 | s390x | riscv64) want_go="${deb_arch}" ;;
  armhf | armel) want_go=arm ;;
  i386) want_go=386 ;;
  ppc64el) want_go=ppc64le ;;
  *) want_go="${deb_arch}" ;;
esac
if [[ "${go_arch}" != "${want_go}" ]]; then
  log "bin/manager is built for GOARCH=${go_arch} but this host's iptables is ${deb_arch}; build the image on a ${go_arch} host"
  exit 1
fi

if ! dpkg-query -W -f='${Status}' iptables 2>/dev/null | grep -q 'install ok installed'; then
  if [[ $(id -u) -ne 0 ]]; then
    log "Debian's iptables package is not installed and installing it needs root"
    exit 1
  fi
  log "installing Debian's iptables package"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y --no-install-recommends iptables >&2 || { apt-get update >&2 && apt-get install -y --no-install-recommends iptables >&2; }
fi

files=$(dpkg -L iptables)
nft_multi=$(grep -E '/xtables-nft-multi$' <<<"${files}" | head -n1)
legacy_multi=$(grep -E '/xtables-legacy-multi$' <<<"${files}" | head -n1)
xtables_dir=$(grep -E '/xtables$' <<<"${files}" | while read -r d; do [[ -d "$d" ]] && echo "$d"; done | head -n1)
if [[ -z "${nft_multi}" || -z "${legacy_multi}" || -z "${xtables_dir}" ]]; then
  log "Debian's iptables package lacks xtables-nft-multi, xtables-legacy-multi or the xtables modules directory"
  exit 1
fi
sbin=$(dirname "${nft_multi}")

stage="${ROOT}.tmp.$$"
rm -rf "${stage}"
trap 'rm -rf "${stage}"' EXIT
mkdir -p "${stage}"

# copy_path PATH copies PATH into the stage at the same place, recreating
# every symlink on the way (merged /usr's /lib -> usr/lib, SONAME links,
# /lib64's loader link) and copying the file they lead to.
copy_path() {
  local path cur="" i n target rest
  path=$(realpath -s -m "$1")
  IFS=/ read -ra parts <<<"${path#/}"
  n=${#parts[@]}
  for ((i = 0; i < n; i++)); do
    cur="${cur}/${parts[i]}"
    if [[ -L "${cur}" ]]; then
      if [[ ! -L "${stage}${cur}" ]]; then
        mkdir -p "${stage}$(dirname "${cur}")"
        cp -P "${cur}" "${stage}${cur}"
      fi
      target=$(readlink "${cur}")
      [[ "${target}" == /* ]] || target="$(dirname "${cur}")/${target}"
      rest=$(IFS=/; echo "${parts[*]:i+1}")
      copy_path "${target}${rest:+/${rest}}"
      return
    fi
  done
  if [[ -d "${path}" ]]; then
    mkdir -p "${stage}${path}"
  elif [[ ! -e "${stage}${path}" ]]; then
    mkdir -p "${stage}$(dirname "${path}")"
    cp -p "${path}" "${stage}${path}"
  fi
}

modules=("${xtables_dir}"/*.so)
objects=("${nft_multi}" "${legacy_multi}" "${modules[@]}")

# Every shared library any of them loads, and the loader (ldd prints it
# as an absolute path without "=>").
# ldd lists the transitive closure; with several files it heads each list
# with "file:".
ldd_out=$(ldd "${objects[@]}") || { log "ldd failed: ${ldd_out}"; exit 1; }
if grep -q 'not found' <<<"${ldd_out}"; then
  log "a library is missing: $(grep 'not found' <<<"${ldd_out}")"
  exit 1
fi
mapfile -t libs < <(awk '/:$/ { next } $2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"${ldd_out}" | sort -u)

for p in "${nft_multi}" "${legacy_multi}" "${libs[@]}"; do
  copy_path "$p"
done
# The modules (and their aliases, such as libxt_state.so) as a whole.
copy_path "${xtables_dir}"
cp -a "${xtables_dir}/." "${stage}$(realpath "${xtables_dir}")/"

# The names xtables-*-multi dispatch on (argv[0]).
for fam in iptables ip6tables; do
  for suffix in "" -save -restore; do
    ln -s xtables-nft-multi "${stage}${sbin}/${fam}-nft${suffix}"
    ln -s xtables-legacy-multi "${stage}${sbin}/${fam}-legacy${suffix}"
  done
done

# iptables-legacy takes /run/xtables.lock (the DaemonSet mounts the node's);
# the directory must exist when it does not.
mkdir -p "${stage}/run"
chmod 0755 "${stage}/run"

rm -rf "${ROOT}"
mv "${stage}" "${ROOT}"
trap - EXIT
log "staged $(find "${ROOT}" -type f | wc -l) files ($(du -sh "${ROOT}" | cut -f1), ${deb_arch}, iptables $(dpkg-query -W -f='${Version}' iptables)) in ${ROOT}"
