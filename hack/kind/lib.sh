# Shared by hack/kind/{up,load,down,smoke}.sh (sourced, not run). The
# caller has cd'd to the repository root.
#   KIND             the kind binary (make kind: bin/kind)
#   KIND_CLUSTER     the cluster name (code-sandbox)
#   KIND_KUBECONFIG  its kubeconfig (bin/kind-cluster/kubeconfig; never
#                    ~/.kube/config)
KIND=${KIND:-bin/kind}
KIND_CLUSTER=${KIND_CLUSTER:-code-sandbox}
KIND_KUBECONFIG=${KIND_KUBECONFIG:-bin/kind-cluster/kubeconfig}
KIND_STATE_DIR=$(dirname "${KIND_KUBECONFIG}")
# The docker shim, on kind's PATH only where --privileged fails.
KIND_SHIM_DIR=${KIND_STATE_DIR}/shim

log() { echo "kind: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

[[ -x ${KIND} ]] || die "no kind binary at ${KIND} (make kind)"
[[ ${KIND_CLUSTER} =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "KIND_CLUSTER=${KIND_CLUSTER}: not a valid cluster name (lower-case letters, digits and '-')"

cluster_exists() { "${KIND}" get clusters 2>/dev/null | grep -qx "${KIND_CLUSTER}"; }

kubectl_kind() { kubectl --kubeconfig "${KIND_KUBECONFIG}" "$@"; }

# use_shim_if_needed IMAGE: kind runs its nodes (and `kind load` its
# imports) with --privileged. Where `docker run --privileged` fails, as on
# VMs that withhold CAP_SYS_RESOURCE from every process, put the shim
# (node-files/docker-shim) first on PATH; where it works, leave docker
# alone. Detected, not assumed.
use_shim_if_needed() {
  local image=$1 err
  if err=$(docker run --rm --privileged --net none --entrypoint true "${image}" 2>&1); then
    rm -rf "${KIND_SHIM_DIR}"
    return 0
  fi
  mkdir -p "${KIND_SHIM_DIR}"
  install -m 0755 hack/kind/node-files/docker-shim "${KIND_SHIM_DIR}/docker"
  local err2
  if ! err2=$("${KIND_SHIM_DIR}/docker" run --rm --privileged --net none --entrypoint true "${image}" 2>&1); then
    die "docker run --privileged ${image} fails, and so does it through the shim:
  without: ${err}
  shim:    ${err2}"
  fi
  log "docker run --privileged fails here (${err%%$'\n'*}); kind runs through the shim ${KIND_SHIM_DIR}/docker"
  PATH=$(cd "${KIND_SHIM_DIR}" && pwd):${PATH}
  export PATH
}
