#!/usr/bin/env bash
# Starts a real single-node Kubernetes cluster on this machine (make
# cluster-up) and writes its admin kubeconfig to bin/cluster/kubeconfig:
#
#   etcd                      Debian's etcd-server (the envtest one), loopback
#   kube-apiserver            front proxy (aggregated APIs), ServiceAccount
#                             issuer, Node,RBAC, NodeRestriction
#   kube-controller-manager   cluster-signing CA, ServiceAccount tokens
#   kube-scheduler
#   containerd 2.x            built from its Go module, private socket/root
#   kubelet                   on that containerd (CRI), cgroupfs, cgroup v1
#   kube-proxy                iptables mode
#   CNI                       Debian's bridge + host-local + portmap + loopback
#   CoreDNS                   Deployment in kube-system, image FROM scratch
#
# The binaries come from hack/setup-cluster-bins.sh (built once, cached per
# user); the pause and CoreDNS images are built FROM scratch and imported
# into containerd, so nothing is ever pulled. Everything runs as host
# processes in their own sessions, with pid files and logs in bin/cluster/.
#
# Rerunning it while the cluster runs is safe: running components are left
# alone, missing ones are started. Stop everything with make cluster-down.
# Needs root (the kubelet, containerd and kube-proxy manage mounts,
# cgroups, network namespaces and iptables).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster-lib.sh"
cd "${CLUSTER_ROOT}"

READY_TIMEOUT="${CLUSTER_UP_TIMEOUT:-300}"
K8S_VERSION="${CLUSTER_K8S_VERSION:-${ENVTEST_K8S_VERSION:-1.37.1}}"
PAUSE_IMAGE="code-sandbox-cluster/pause:1"
COREDNS_IMAGE="code-sandbox-cluster/coredns:1"

if [[ ${EUID} -ne 0 ]]; then
  clog "must run as root (the kubelet, containerd and kube-proxy manage mounts, cgroups and iptables)"
  exit 1
fi

# --- prerequisites -----------------------------------------------------------
need_pkgs=()
command -v runc >/dev/null || need_pkgs+=(runc)
command -v conntrack >/dev/null || need_pkgs+=(conntrack)
command -v iptables >/dev/null || need_pkgs+=(iptables)
command -v ctr >/dev/null || need_pkgs+=(containerd) # only for its ctr client
[[ -x "${CLUSTER_CNI_BIN_DIR}/bridge" ]] || need_pkgs+=(containernetworking-plugins)
if ((${#need_pkgs[@]})); then
  clog "installing Debian packages: ${need_pkgs[*]}"
  apt-get update -qq >&2 || true
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >&2
fi
# cluster-up only ever uses Debian's containerd package for its ctr
# client; make sure its daemon is not what we talk to by accident.

BIN="${CLUSTER_BIN:-$(hack/setup-cluster-bins.sh)}"
ASSETS="$(hack/setup-envtest.sh)" # etcd
export PATH="${BIN}:${PATH}"      # containerd finds containerd-shim-runc-v2 here
KUBECTL="${BIN}/kubectl"

NODE_IP="${CLUSTER_NODE_IP:-$(ip -4 route get 1.1.1.1 2>/dev/null | sed -nE 's/.* src ([0-9.]+).*/\1/p' | head -n1)}"
if [[ -z "${NODE_IP}" ]]; then
  clog "cannot tell the node's IP address (no default route); set CLUSTER_NODE_IP"
  exit 1
fi

mkdir -p "${CLUSTER_DIR}" "${CLUSTER_LOGS}" "${CLUSTER_PIDS}" "${CLUSTER_STATE}" "${CLUSTER_RUN}"
chmod 700 "${CLUSTER_STATE}" "${CLUSTER_RUN}"

# --- PKI and kubeconfigs -------------------------------------------------------
# Made with the operator's own certificate code (internal/operatorca), like
# the envtest control plane's front proxy. Idempotent.
go build -o "${CLUSTER_DIR}/clusterpki" ./hack/clusterpki
"${CLUSTER_DIR}/clusterpki" --dir "${CLUSTER_PKI}" --admin-kubeconfig "${CLUSTER_KUBECONFIG}" \
  --node-name "${CLUSTER_NODE_NAME}" --node-ip "${NODE_IP}" --service-ip "${CLUSTER_SERVICE_IP}" --port "${CLUSTER_API_PORT}"
P="${CLUSTER_PKI}"

# --- helpers -----------------------------------------------------------------
# start NAME BINARY ARGS...: start a component in its own session unless it
# already runs.
start() {
  local name="$1" bin="$2"
  shift 2
  if pid=$(cpid "${name}"); then
    clog "${name} already runs (pid ${pid})"
    return 0
  fi
  clog "starting ${name} (log: ${CLUSTER_LOGS}/${name}.log)"
  nohup setsid "${bin}" "$@" >>"${CLUSTER_LOGS}/${name}.log" 2>&1 </dev/null &
  echo $! >"${CLUSTER_PIDS}/${name}.pid"
}

# wait_for NAME TIMEOUT CMD...: wait until CMD succeeds, failing early with
# the component's log when it dies.
wait_for() {
  local name="$1" timeout="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if [[ -n "${name}" ]] && ! cpid "${name}" >/dev/null; then
      clog "${name} exited; last lines of ${CLUSTER_LOGS}/${name}.log:"
      tail -n 40 "${CLUSTER_LOGS}/${name}.log" >&2 || true
      exit 1
    fi
    if ((SECONDS >= deadline)); then
      clog "timed out after ${timeout}s waiting for: $*"
      [[ -n "${name}" ]] && { tail -n 40 "${CLUSTER_LOGS}/${name}.log" >&2 || true; }
      exit 1
    fi
    sleep 1
  done
}

k() { "${KUBECTL}" --kubeconfig "${CLUSTER_KUBECONFIG}" "$@"; }

# write_config FILE: stdin to FILE, unless FILE already holds exactly that
# (kube-proxy exits when its configuration file is written to, so a rerun
# must not touch it).
write_config() {
  local tmp="$1.tmp"
  cat >"${tmp}"
  if cmp -s "${tmp}" "$1"; then
    rm -f "${tmp}"
  else
    mv "${tmp}" "$1"
  fi
}

# --- containerd ----------------------------------------------------------------
mkdir -p "${CLUSTER_STATE}/containerd" "${CLUSTER_RUN}/containerd" "${CLUSTER_STATE}/cni/net.d" "${CLUSTER_STATE}/cni/networks"
write_config "${CLUSTER_DIR}/containerd.toml" <<EOF
# containerd for the local cluster only: its own root, state and socket,
# nothing shared with the Docker Engine's containerd.
version = 3
root = "${CLUSTER_STATE}/containerd"
state = "${CLUSTER_RUN}/containerd"
# Plugins that would look for devices or filesystems this cluster does not use.
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "${CONTAINERD_SOCK}"

[ttrpc]
  address = "${CONTAINERD_SOCK}.ttrpc"

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "${CLUSTER_STATE}/containerd/opt"
  # NRI's socket would be the machine-wide /var/run/nri/nri.sock.
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      # Built FROM scratch by cluster-up and imported; never pulled.
      sandbox = "docker.io/${PAUSE_IMAGE}"
  [plugins.'io.containerd.cri.v1.runtime']
    # This VM forbids lowering oom_score_adj: without this every pod
    # sandbox fails with "can't get final child's PID from pipe".
    restrict_oom_score_adj = true
    # Network namespaces under the state dir, not the shared /var/run/netns.
    netns_mounts_under_state_dir = true
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["${CLUSTER_CNI_BIN_DIR}"]
      conf_dir = "${CLUSTER_STATE}/cni/net.d"
      max_conf_num = 1
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
EOF

# The pod network: one bridge, one /24, masquerading to the outside.
write_config "${CLUSTER_STATE}/cni/net.d/10-code-sandbox-cluster.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "${CLUSTER_CNI_NETWORK}",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "${CLUSTER_BRIDGE}",
      "isGateway": true,
      "ipMasq": true,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "${CLUSTER_STATE}/cni/networks",
        "ranges": [[{"subnet": "${CLUSTER_POD_CIDR}"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF

start containerd "${BIN}/containerd" --config "${CLUSTER_DIR}/containerd.toml"
wait_for containerd 60 cctr version

# The pause and CoreDNS images, FROM scratch, built with the machine's
# Docker Engine and imported into the cluster's containerd.
build_image() { # IMAGE BINARY
  local image="$1" binary="$2" ctx
  if cctr images ls -q | grep -qx "docker.io/${image}"; then
    return 0
  fi
  ctx=$(mktemp -d)
  cp "${binary}" "${ctx}/$(basename "${binary}")"
  printf 'FROM scratch\nCOPY %s /%s\nUSER 65532:65532\nENTRYPOINT ["/%s"]\n' \
    "$(basename "${binary}")" "$(basename "${binary}")" "$(basename "${binary}")" >"${ctx}/Dockerfile"
  clog "building ${image} and importing it into the cluster's containerd"
  docker build -q -t "${image}" "${ctx}" >/dev/null
  rm -rf "${ctx}"
  docker save "${image}" | cctr images import - >/dev/null
}
mkdir -p "${CLUSTER_DIR}/images"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${CLUSTER_DIR}/images/pause" ./hack/clusterpause
build_image "${PAUSE_IMAGE}" "${CLUSTER_DIR}/images/pause"
build_image "${COREDNS_IMAGE}" "${BIN}/coredns"

# --- pod network forwarding ------------------------------------------------------
# Docker sets FORWARD's policy to DROP and br_netfilter sends bridged
# traffic through it: accept the pod network's traffic in a chain of our own
# (cluster-down removes it; Docker's chains are never touched).
iptables -N "${CLUSTER_FWD_CHAIN}" 2>/dev/null || true
iptables -C "${CLUSTER_FWD_CHAIN}" -s "${CLUSTER_POD_CIDR}" -j ACCEPT 2>/dev/null ||
  iptables -A "${CLUSTER_FWD_CHAIN}" -s "${CLUSTER_POD_CIDR}" -j ACCEPT
iptables -C "${CLUSTER_FWD_CHAIN}" -d "${CLUSTER_POD_CIDR}" -j ACCEPT 2>/dev/null ||
  iptables -A "${CLUSTER_FWD_CHAIN}" -d "${CLUSTER_POD_CIDR}" -j ACCEPT
iptables -C FORWARD -m comment --comment "code-sandbox-cluster pod network" -j "${CLUSTER_FWD_CHAIN}" 2>/dev/null ||
  iptables -A FORWARD -m comment --comment "code-sandbox-cluster pod network" -j "${CLUSTER_FWD_CHAIN}"

# --- control plane ---------------------------------------------------------------
mkdir -p "${CLUSTER_STATE}/etcd"
start etcd "${ASSETS}/etcd" --name code-sandbox-cluster --data-dir "${CLUSTER_STATE}/etcd" \
  --listen-client-urls "http://127.0.0.1:${CLUSTER_ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${CLUSTER_ETCD_PORT}" \
  --listen-peer-urls "http://127.0.0.1:${CLUSTER_ETCD_PEER_PORT}" --initial-advertise-peer-urls "http://127.0.0.1:${CLUSTER_ETCD_PEER_PORT}" \
  --initial-cluster "code-sandbox-cluster=http://127.0.0.1:${CLUSTER_ETCD_PEER_PORT}" \
  --listen-metrics-urls "" --log-level warn
wait_for etcd 60 curl -fsS "http://127.0.0.1:${CLUSTER_ETCD_PORT}/health"

start kube-apiserver "${BIN}/kube-apiserver" \
  --etcd-servers "http://127.0.0.1:${CLUSTER_ETCD_PORT}" \
  --bind-address 0.0.0.0 --secure-port "${CLUSTER_API_PORT}" --advertise-address "${NODE_IP}" \
  --tls-cert-file "${P}/apiserver.crt" --tls-private-key-file "${P}/apiserver.key" \
  --client-ca-file "${P}/ca.crt" \
  --service-cluster-ip-range "${CLUSTER_SERVICE_CIDR}" \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file "${P}/sa.pub" --service-account-signing-key-file "${P}/sa.key" \
  --authorization-mode Node,RBAC \
  --enable-admission-plugins NodeRestriction \
  --admission-control-config-file "${P}/webhook-client/admission-configuration.yaml" \
  --allow-privileged=true \
  --kubelet-client-certificate "${P}/apiserver-kubelet-client.crt" --kubelet-client-key "${P}/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "${P}/ca.crt" \
  --kubelet-preferred-address-types InternalIP,Hostname \
  --requestheader-client-ca-file "${P}/front-proxy-ca.crt" \
  --requestheader-allowed-names front-proxy-client \
  --requestheader-username-headers X-Remote-User \
  --requestheader-uid-headers X-Remote-Uid \
  --requestheader-group-headers X-Remote-Group \
  --requestheader-extra-headers-prefix X-Remote-Extra- \
  --proxy-client-cert-file "${P}/front-proxy-client.crt" --proxy-client-key-file "${P}/front-proxy-client.key" \
  --profiling=false
wait_for kube-apiserver 120 k get --raw /readyz

start kube-controller-manager "${BIN}/kube-controller-manager" \
  --kubeconfig "${P}/controller-manager.kubeconfig" \
  --authentication-kubeconfig "${P}/controller-manager.kubeconfig" \
  --authorization-kubeconfig "${P}/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 \
  --cluster-signing-cert-file "${P}/ca.crt" --cluster-signing-key-file "${P}/ca.key" \
  --root-ca-file "${P}/ca.crt" \
  --service-account-private-key-file "${P}/sa.key" \
  --use-service-account-credentials=true \
  --service-cluster-ip-range "${CLUSTER_SERVICE_CIDR}" \
  --allocate-node-cidrs=false \
  --leader-elect=false \
  --profiling=false

start kube-scheduler "${BIN}/kube-scheduler" \
  --kubeconfig "${P}/scheduler.kubeconfig" \
  --authentication-kubeconfig "${P}/scheduler.kubeconfig" \
  --authorization-kubeconfig "${P}/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 \
  --leader-elect=false \
  --profiling=false

# --- node ----------------------------------------------------------------------------
mkdir -p "${CLUSTER_STATE}/kubelet" "${CLUSTER_STATE}/pod-logs"
swap_on=false
[[ $(wc -l </proc/swaps) -gt 1 ]] && swap_on=true
write_config "${CLUSTER_DIR}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://${CONTAINERD_SOCK}
# This machine runs cgroup v1, which kubelets refuse by default since 1.35.
failCgroupV1: false
cgroupDriver: cgroupfs
failSwapOn: $([[ ${swap_on} == true ]] && echo false || echo true)
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: ${P}/ca.crt
authorization:
  mode: Webhook
tlsCertFile: ${P}/kubelet.crt
tlsPrivateKeyFile: ${P}/kubelet.key
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDomain: cluster.local
clusterDNS:
- ${CLUSTER_DNS_IP}
resolvConf: /etc/resolv.conf
podLogsDir: ${CLUSTER_STATE}/pod-logs
staticPodPath: ""
serializeImagePulls: false
# Images are imported, never pulled: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 2%
  imagefs.available: 2%
EOF
# The kubelet sets kernel tunables every node has (vm.overcommit_memory=1,
# kernel.panic=10, kernel.panic_on_oops=1); remember the machine's values
# once, so that cluster-down puts them back.
if [[ ! -s "${CLUSTER_DIR}/sysctl.saved" ]]; then
  for s in "${CLUSTER_SYSCTLS[@]}"; do
    if [[ -e "/proc/sys/${s//.//}" ]]; then echo "${s}=$(sysctl -n "${s}")"; fi
  done >"${CLUSTER_DIR}/sysctl.saved"
fi
start kubelet "${BIN}/kubelet" --config "${CLUSTER_DIR}/kubelet.yaml" \
  --kubeconfig "${P}/kubelet.kubeconfig" --root-dir "${CLUSTER_STATE}/kubelet" \
  --hostname-override "${CLUSTER_NODE_NAME}" --node-ip "${NODE_IP}"

write_config "${CLUSTER_DIR}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ${P}/kube-proxy.kubeconfig
mode: iptables
clusterCIDR: ${CLUSTER_POD_CIDR}
hostnameOverride: ${CLUSTER_NODE_NAME}
bindAddress: ${NODE_IP}
# NodePorts on the node's address only.
nodePortAddresses:
- primary
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# Leave the machine's conntrack sysctls alone, and route_localnet off (no
# NodePorts on 127.0.0.1).
conntrack:
  maxPerCore: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
EOF
start kube-proxy "${BIN}/kube-proxy" --config "${CLUSTER_DIR}/kube-proxy.yaml"

clog "waiting for node ${CLUSTER_NODE_NAME} to register and become Ready"
wait_for kubelet 120 k get node "${CLUSTER_NODE_NAME}"
wait_for kubelet "${READY_TIMEOUT}" k wait --for=condition=Ready "node/${CLUSTER_NODE_NAME}" --timeout=5s

# --- cluster DNS ------------------------------------------------------------------------
# CoreDNS as a Deployment (its ServiceAccount, RBAC and kube-dns Service as
# a kubeadm cluster has them), non-root on port 1053; the Service maps 53.
k apply --server-side --force-conflicts -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata:
  name: coredns
  namespace: kube-system
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: system:coredns
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: system:coredns
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: system:coredns
subjects:
- kind: ServiceAccount
  name: coredns
  namespace: kube-system
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: coredns
  namespace: kube-system
data:
  Corefile: |
    .:1053 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
            ttl 30
        }
        forward . /etc/resolv.conf
        cache 30
        loop
        reload
    }
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: coredns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  replicas: 1
  selector:
    matchLabels:
      k8s-app: kube-dns
  template:
    metadata:
      labels:
        k8s-app: kube-dns
    spec:
      serviceAccountName: coredns
      priorityClassName: system-cluster-critical
      # The node's resolver is CoreDNS's upstream.
      dnsPolicy: Default
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        runAsGroup: 65532
        seccompProfile:
          type: RuntimeDefault
      containers:
      - name: coredns
        image: ${COREDNS_IMAGE}
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 1053, protocol: UDP}
        - {name: dns-tcp, containerPort: 1053, protocol: TCP}
        securityContext:
          allowPrivilegeEscalation: false
          readOnlyRootFilesystem: true
          capabilities:
            drop: [ALL]
        livenessProbe:
          httpGet: {path: /health, port: 8080}
          initialDelaySeconds: 10
        readinessProbe:
          httpGet: {path: /ready, port: 8181}
        resources:
          requests: {cpu: 50m, memory: 32Mi}
          limits: {memory: 128Mi}
        volumeMounts:
        - {name: config, mountPath: /etc/coredns, readOnly: true}
      volumes:
      - name: config
        configMap:
          name: coredns
---
apiVersion: v1
kind: Service
metadata:
  name: kube-dns
  namespace: kube-system
  labels:
    k8s-app: kube-dns
spec:
  clusterIP: ${CLUSTER_DNS_IP}
  selector:
    k8s-app: kube-dns
  ports:
  - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
EOF
wait_for "" "${READY_TIMEOUT}" k -n kube-system rollout status deployment/coredns --timeout=5s

clog "ready: Kubernetes v${K8S_VERSION}, node ${CLUSTER_NODE_NAME} (${NODE_IP}); kubeconfig ${CLUSTER_KUBECONFIG}"
clog "  export KUBECONFIG=${CLUSTER_KUBECONFIG}; make cluster-deploy"
