# Shared by hack/cluster-up.sh, hack/cluster-down.sh and hack/cluster-load.sh:
# where the local single-node cluster keeps its state, and how its processes
# are found. Source it; it defines variables and functions only.
#
# The cluster never shares a path, socket or network name with the Docker
# Engine on the same machine (or its containerd): everything it owns is
# under CLUSTER_DIR (certificates, kubeconfigs, logs, pid files; in the
# clone, ignored by git), CLUSTER_STATE (etcd, containerd's root, the
# kubelet's root, CNI state) and CLUSTER_RUN (containerd's state and socket,
# the pods' network namespaces).

CLUSTER_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CLUSTER_DIR="${CLUSTER_DIR:-${CLUSTER_ROOT}/bin/cluster}"
CLUSTER_STATE="${CLUSTER_STATE:-/var/lib/code-sandbox-cluster}"
CLUSTER_RUN="${CLUSTER_RUN:-/run/code-sandbox-cluster}"
CLUSTER_PKI="${CLUSTER_DIR}/pki"
CLUSTER_LOGS="${CLUSTER_DIR}/logs"
CLUSTER_PIDS="${CLUSTER_DIR}/pids"
CLUSTER_KUBECONFIG="${CLUSTER_DIR}/kubeconfig"
CONTAINERD_SOCK="${CLUSTER_RUN}/containerd.sock"
# Where hack/setup-cluster-bins.sh caches the binaries.
CLUSTER_K8S_VERSION="${CLUSTER_K8S_VERSION:-${ENVTEST_K8S_VERSION:-1.37.1}}"
CLUSTER_BIN_DIR="${CODE_SANDBOX_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/code-sandbox-operator}/cluster/${CLUSTER_K8S_VERSION}"

CLUSTER_NODE_NAME="${CLUSTER_NODE_NAME:-code-sandbox-node}"
CLUSTER_SERVICE_CIDR="${CLUSTER_SERVICE_CIDR:-10.96.0.0/16}"
CLUSTER_SERVICE_IP="${CLUSTER_SERVICE_IP:-10.96.0.1}"
CLUSTER_DNS_IP="${CLUSTER_DNS_IP:-10.96.0.10}"
CLUSTER_POD_CIDR="${CLUSTER_POD_CIDR:-10.244.0.0/24}"
CLUSTER_API_PORT="${CLUSTER_API_PORT:-6443}"
# etcd listens on loopback only, on ports away from etcd's defaults so that
# it never meets another etcd on the machine.
CLUSTER_ETCD_PORT="${CLUSTER_ETCD_PORT:-23790}"
CLUSTER_ETCD_PEER_PORT="${CLUSTER_ETCD_PEER_PORT:-23800}"
# The CNI network and its bridge. The iptables chain CSC-FORWARD accepts
# the pod network's forwarded traffic (the FORWARD policy is DROP where the
# Docker Engine runs, and bridged traffic is filtered: br_netfilter).
CLUSTER_CNI_NETWORK="code-sandbox-cluster"
CLUSTER_BRIDGE="cni0"
CLUSTER_FWD_CHAIN="CSC-FORWARD"
CLUSTER_CNI_BIN_DIR="${CLUSTER_CNI_BIN_DIR:-/usr/lib/cni}"

# Kernel tunables the kubelet and kube-proxy may change; cluster-up saves
# their values, cluster-down restores them.
CLUSTER_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max
  net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait)

# The components, in start order (cluster-down stops them in reverse).
CLUSTER_COMPONENTS=(containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

clog() { echo "$(basename "$0" .sh): $*" >&2; }

# alive PID: the process exists and is not a zombie.
calive() {
  local state
  state=$(sed -E 's/^.*\) ([A-Za-z]).*$/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "${state}" && "${state}" != Z ]]
}

# cpid NAME prints the pid of the component NAME if its pid file names a
# live process running that binary (a recycled pid belongs to someone else).
cpid() {
  local f="${CLUSTER_PIDS}/$1.pid" pid exe
  [[ -s "${f}" ]] || return 1
  pid=$(<"${f}")
  [[ "${pid}" =~ ^[0-9]+$ ]] && calive "${pid}" || return 1
  exe=$(readlink "/proc/${pid}/exe" 2>/dev/null) || return 1
  [[ "$(basename "${exe}")" == "$1" ]] || return 1
  echo "${pid}"
}

# cctr runs Debian's ctr against the cluster's containerd.
cctr() { ctr --address "${CONTAINERD_SOCK}" --namespace k8s.io "$@"; }
