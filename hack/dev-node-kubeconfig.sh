#!/usr/bin/env bash
# Writes a kubeconfig for the node manager of node NODE, as a cluster gives
# one to the manager DaemonSet's Pod on that node: the manager
# ServiceAccount's token bound to a Pod that runs on NODE. The API server
# then adds the node's name to every request made with it (the user's extra
# authentication.kubernetes.io/node-name), which is what the Sandbox status
# policy (config/policy) and the node certificate signer (`bin/manager
# --role control-plane`) check.
#
#   hack/dev-node-kubeconfig.sh ADMIN_KUBECONFIG NODE OUT [DURATION]
#
# With the admin kubeconfig it creates, unless they exist, the Node NODE and
# the Pod OPERATOR_NAMESPACE/MANAGER_SERVICE_ACCOUNT-NODE with spec.nodeName
# NODE (no kubelet runs it: it only anchors the token). The manager
# ServiceAccount must exist (config/dev/operator, or config/default, creates
# it). The token (valid for DURATION, default 24h, and as long as the Pod
# exists) goes to OUT.token, which OUT names as its tokenFile: rerunning
# the script renews the token, and a running manager picks up the new one
# without a restart. The server and its CA are the admin kubeconfig's.
#
# make run, make dev-up-system (hack/dev-lib.sh) and the e2e suite use it.
set -euo pipefail

log() { echo "dev-node-kubeconfig: $*" >&2; }

if (($# < 3 || $# > 4)); then
  echo "usage: $0 ADMIN_KUBECONFIG NODE OUT [DURATION]" >&2
  exit 2
fi
ADMIN=$1
NODE=$2
OUT=$3
DURATION=${4:-24h}
KUBECTL="${KUBECTL:-kubectl}"
NAMESPACE="${OPERATOR_NAMESPACE:-code-sandbox-system}"
SERVICE_ACCOUNT="${MANAGER_SERVICE_ACCOUNT:-code-sandbox-controller-manager}"
POD="${SERVICE_ACCOUNT}-${NODE}"
NODE_NAME_EXTRA="authentication.kubernetes.io/node-name"

kc() { timeout 30 "${KUBECTL}" --kubeconfig "${ADMIN}" "$@"; }

if ! kc get serviceaccount "${SERVICE_ACCOUNT}" -n "${NAMESPACE}" -o name >/dev/null; then
  log "ServiceAccount ${NAMESPACE}/${SERVICE_ACCOUNT} does not exist; apply config/dev/operator first"
  exit 1
fi

# Server-side apply: idempotent, and a Pod that exists already is left as
# it is (its spec cannot change; an identical apply is a no-op).
kc apply --server-side --field-manager=dev-node-kubeconfig -f - >/dev/null <<EOF
apiVersion: v1
kind: Node
metadata:
  name: ${NODE}
  labels:
    kubernetes.io/hostname: ${NODE}
    kubernetes.io/os: linux
---
apiVersion: v1
kind: Pod
metadata:
  name: ${POD}
  namespace: ${NAMESPACE}
  labels:
    app.kubernetes.io/name: code-sandbox-operator
    app.kubernetes.io/component: manager
  annotations:
    code-sandbox.dev/purpose: "Anchors the Pod-bound token of the local node manager of ${NODE} (hack/dev-node-kubeconfig.sh); no kubelet runs it."
spec:
  nodeName: ${NODE}
  serviceAccountName: ${SERVICE_ACCOUNT}
  automountServiceAccountToken: false
  containers:
  - name: manager
    image: code-sandbox-operator/manager:latest
EOF
# The aggregated API server dials a node API only at one of its Node's
# addresses, which a kubelet reports; there is none here, so the Node gets
# the address its manager advertises (NODE_ADDRESS, loopback by default).
kc patch node "${NODE}" --subresource=status --type=merge \
  -p "{\"status\":{\"addresses\":[{\"type\":\"InternalIP\",\"address\":\"${NODE_ADDRESS:-127.0.0.1}\"}]}}" >/dev/null

pod_node=$(kc get pod "${POD}" -n "${NAMESPACE}" -o jsonpath='{.spec.nodeName} {.spec.serviceAccountName}')
if [[ "${pod_node}" != "${NODE} ${SERVICE_ACCOUNT}" ]]; then
  log "Pod ${NAMESPACE}/${POD} exists with node and ServiceAccount \"${pod_node}\", not \"${NODE} ${SERVICE_ACCOUNT}\"; delete it"
  exit 1
fi
uid=$(kc get pod "${POD}" -n "${NAMESPACE}" -o jsonpath='{.metadata.uid}')
token=$(kc create token "${SERVICE_ACCOUNT}" -n "${NAMESPACE}" --duration "${DURATION}" \
  --bound-object-kind Pod --bound-object-name "${POD}" --bound-object-uid "${uid}")

server=$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.server}')
ca=$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
if [[ -z "${ca}" ]]; then
  ca_file=$(kc config view --raw --minify -o jsonpath='{.clusters[0].cluster.certificate-authority}')
  [[ -n "${ca_file}" ]] || { log "${ADMIN} names no certificate authority for its cluster"; exit 1; }
  [[ "${ca_file}" == /* ]] || ca_file="$(dirname "${ADMIN}")/${ca_file}"
  ca=$(base64 -w0 <"${ca_file}")
fi

# Written atomically: a running manager re-reads the token file.
mkdir -p "$(dirname "${OUT}")"
umask 077
printf '%s' "${token}" >"${OUT}.token.tmp"
mv -f "${OUT}.token.tmp" "${OUT}.token"
cat >"${OUT}.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: code-sandbox-dev
  cluster:
    server: ${server}
    certificate-authority-data: ${ca}
users:
- name: ${SERVICE_ACCOUNT}@${NODE}
  user:
    # Relative to this file.
    tokenFile: $(basename "${OUT}").token
contexts:
- name: ${SERVICE_ACCOUNT}@${NODE}
  context:
    cluster: code-sandbox-dev
    user: ${SERVICE_ACCOUNT}@${NODE}
current-context: ${SERVICE_ACCOUNT}@${NODE}
EOF
mv -f "${OUT}.tmp" "${OUT}"

# The node binding is the point: check that the API server sees it.
who=$(timeout 30 "${KUBECTL}" --kubeconfig "${OUT}" auth whoami \
  -o jsonpath="{.status.userInfo.username} {.status.userInfo.extra.${NODE_NAME_EXTRA//./\\.}[*]}")
want="system:serviceaccount:${NAMESPACE}:${SERVICE_ACCOUNT} ${NODE}"
if [[ "${who}" != "${want}" ]]; then
  log "the API server sees ${OUT}'s user as \"${who}\", not \"${want}\" (does it add ${NODE_NAME_EXTRA} to Pod-bound tokens?)"
  exit 1
fi
log "wrote ${OUT} (${want}, token valid for ${DURATION})"
