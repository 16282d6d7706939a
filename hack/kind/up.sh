#!/usr/bin/env bash
# make kind-up: creates the kind cluster KIND_CLUSTER (one control plane,
# two workers; config/kind/cluster.yaml) from KIND_NODE_IMAGE, writes its
# kubeconfig to KIND_KUBECONFIG and waits until every node is Ready and
# CoreDNS runs. Safe to rerun: an existing cluster is kept, its kubeconfig
# rewritten and its readiness checked.
#
# Node images built by hack/kind/node-image.sh carry the label
# dev.code-sandbox.kind.cni=simple-cni: they bring their own CNI, so kind's
# default one (kindnetd, pulled from a registry) is disabled. Any other
# image (kindest/node:...) keeps kindnetd.
set -euo pipefail
cd "$(dirname "$0")/../.."
# shellcheck source=hack/kind/lib.sh
source hack/kind/lib.sh

NODE_IMAGE=${KIND_NODE_IMAGE:?KIND_NODE_IMAGE: the node image (make kind-up sets it)}
READY_TIMEOUT=${KIND_READY_TIMEOUT:-300}
CONFIG=config/kind/cluster.yaml
NODES=3

if ! docker image inspect "${NODE_IMAGE}" >/dev/null 2>&1; then
  log "pulling ${NODE_IMAGE}"
  docker pull "${NODE_IMAGE}" >&2 || die "node image ${NODE_IMAGE} is neither in Docker nor pullable (unset KIND_NODE_IMAGE to build one offline: make kind-image)"
fi
use_shim_if_needed "${NODE_IMAGE}"
# Every kubelet and containerd in the nodes takes inotify instances from this
# machine's per-user limit (128 on Debian): past it, a worker's kubelet
# exits with "inotify_init: too many open files" and never joins. kind's
# known-issues page gives these values.
for kv in fs.inotify.max_user_instances=1024 fs.inotify.max_user_watches=524288; do
  if (($(sysctl -n "${kv%%=*}") < ${kv#*=})); then
    sysctl -qw "${kv}" || die "${kv%%=*} is $(sysctl -n "${kv%%=*}"), too low for three kind nodes; raise it to ${kv#*=} (as root)"
  fi
done
mkdir -p "${KIND_STATE_DIR}"

start=${SECONDS}
if cluster_exists; then
  log "cluster ${KIND_CLUSTER} exists; writing ${KIND_KUBECONFIG}"
  "${KIND}" export kubeconfig --name "${KIND_CLUSTER}" --kubeconfig "${KIND_KUBECONFIG}" >&2
else
  cfg=${KIND_STATE_DIR}/${KIND_CLUSTER}.yaml
  cni=$(docker image inspect -f '{{index .Config.Labels "dev.code-sandbox.kind.cni"}}' "${NODE_IMAGE}")
  if [[ -n ${cni} ]]; then
    sed 's/^  disableDefaultCNI: false$/  disableDefaultCNI: true/' "${CONFIG}" >"${cfg}"
    grep -q '^  disableDefaultCNI: true$' "${cfg}" || die "${CONFIG} has no line '  disableDefaultCNI: false' to flip for ${cni}"
    log "the node image brings its own CNI (${cni}): kind's kindnetd is disabled"
  else
    cp "${CONFIG}" "${cfg}"
  fi
  # kube-apiserver presents a client certificate to admission webhooks
  # (internal/webhookclient), so that the operator's webhook can require
  # it (make kind-deploy passes the CA as WEBHOOK_CLIENT_CA). The directory
  # is mounted into the control plane node, and from there into the
  # kube-apiserver Pod, at the same absolute path its files name.
  wc_dir=$(cd "${KIND_STATE_DIR}" && pwd)/webhook-client
  go run ./hack/kindwebhookclient "${wc_dir}"
  sed -i "s#^- role: control-plane\$#- role: control-plane\n  extraMounts:\n  - hostPath: ${wc_dir}\n    containerPath: ${wc_dir}\n    readOnly: true#" "${cfg}"
  grep -q "containerPath: ${wc_dir}" "${cfg}" || die "${CONFIG} has no line '- role: control-plane' to mount ${wc_dir} on"
  cat >>"${cfg}" <<EOF
kubeadmConfigPatchesJSON6902:
- group: kubeadm.k8s.io
  version: v1beta4
  kind: ClusterConfiguration
  patch: |
    - op: add
      path: /apiServer/extraArgs/-
      value: {name: admission-control-config-file, value: ${wc_dir}/admission-configuration.yaml}
    - op: add
      path: /apiServer/extraVolumes
      value: [{name: webhook-client, hostPath: ${wc_dir}, mountPath: ${wc_dir}, readOnly: true, pathType: Directory}]
EOF
  log "creating cluster ${KIND_CLUSTER} from ${NODE_IMAGE}"
  "${KIND}" create cluster --name "${KIND_CLUSTER}" --config "${cfg}" --image "${NODE_IMAGE}" \
    --kubeconfig "${KIND_KUBECONFIG}" >&2
  log "TIMING kind create cluster: $((SECONDS - start))s"
fi

deadline=$((SECONDS + READY_TIMEOUT))
until [[ $(kubectl_kind get nodes --no-headers 2>/dev/null | wc -l) -ge ${NODES} ]]; do
  ((SECONDS < deadline)) || die "cluster ${KIND_CLUSTER} has fewer than ${NODES} nodes after ${READY_TIMEOUT}s (a missing node's kubelet log: docker exec <node> journalctl -u kubelet): $(kubectl_kind get nodes 2>&1)"
  sleep 2
done
kubectl_kind wait --for=condition=Ready node --all --timeout="$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))s" >&2 ||
  die "not every node of ${KIND_CLUSTER} is Ready: $(kubectl_kind get nodes -o wide 2>&1)"
log "TIMING all ${NODES} nodes Ready: $((SECONDS - start))s"
kubectl_kind -n kube-system rollout status deployment/coredns --timeout="$((deadline - SECONDS > 1 ? deadline - SECONDS : 1))s" >&2 ||
  die "CoreDNS does not run in ${KIND_CLUSTER}: $(kubectl_kind -n kube-system get pods -o wide 2>&1)"
log "TIMING CoreDNS available: $((SECONDS - start))s"
kubectl_kind get nodes -o wide >&2
log "cluster ${KIND_CLUSTER} is up: export KUBECONFIG=$(cd "${KIND_STATE_DIR}" && pwd)/$(basename "${KIND_KUBECONFIG}")"
