#!/usr/bin/env bash
# Stops the local single-node cluster (make cluster-down) and leaves nothing
# of it behind: no process, no mount, no network interface, no iptables rule
# or chain, no container. Only what the cluster owns is touched: processes
# named in its pid files or living in its pod cgroups, mounts under its own
# directories, the cni0 bridge and its veths, and the KUBE-*, CNI-* and
# CSC-* chains (Docker's chains and rules are never touched). Safe to run
# when nothing runs, and after a crash.
#
# The certificates, kubeconfigs and pid files in bin/cluster/ and all of
# /var/lib/code-sandbox-cluster are removed, so the next cluster-up starts
# a fresh cluster; the logs stay in bin/cluster/logs/ until then.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cluster-lib.sh"

if [[ ${EUID} -ne 0 ]]; then
  clog "must run as root"
  exit 1
fi

# stop NAME: SIGTERM, up to 20 s, then SIGKILL.
stop() {
  local pid
  pid=$(cpid "$1") || { rm -f "${CLUSTER_PIDS}/$1.pid"; return 0; }
  clog "stopping $1 (pid ${pid})"
  kill -TERM "${pid}" 2>/dev/null
  for _ in $(seq 1 40); do
    calive "${pid}" || break
    sleep 0.5
  done
  if calive "${pid}"; then
    clog "$1 did not stop; killing it"
    kill -KILL "${pid}" 2>/dev/null
    sleep 0.5
  fi
  rm -f "${CLUSTER_PIDS}/$1.pid"
}

# Sandboxes first, while the node's manager still runs to remove their
# containers from the Docker Engine; whatever is left of them (no operator
# deployed, or it did not finish) goes below.
if cpid kube-apiserver >/dev/null && [[ -s "${CLUSTER_KUBECONFIG}" ]] &&
  "${CLUSTER_BIN_DIR}/kubectl" --kubeconfig "${CLUSTER_KUBECONFIG}" get crd sandboxes.sandbox.code-sandbox.dev >/dev/null 2>&1; then
  clog "deleting every Sandbox"
  "${CLUSTER_BIN_DIR}/kubectl" --kubeconfig "${CLUSTER_KUBECONFIG}" delete sandboxes.sandbox.code-sandbox.dev \
    --all --all-namespaces --wait --timeout=60s >/dev/null 2>&1 || true
fi

# The node first, so that nothing restarts the pods we remove; the control
# plane after the pods, whose watches would hold up its graceful shutdown.
for c in kube-proxy kubelet; do
  stop "${c}"
done

# Every pod container and sandbox: kill every process in the pods' cgroups
# (the kubelet's cgroupfs hierarchy, kubepods), then delete the tasks and
# containers through containerd while it runs, in parallel (the shims exit).
kill_pods() {
  local ctl pid
  for ctl in /sys/fs/cgroup/*/; do
    [[ -d "${ctl}kubepods" ]] || continue
    while read -r pid; do
      [[ -n "${pid}" ]] && kill -KILL "${pid}" 2>/dev/null || true
    done < <(find "${ctl}kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null)
  done
}
kill_pods
if cpid containerd >/dev/null; then
  tasks=$(cctr tasks ls -q 2>/dev/null || true)
  for t in ${tasks}; do cctr tasks kill -s SIGKILL "${t}" >/dev/null 2>&1 || true; done
  for t in ${tasks}; do cctr tasks delete -f "${t}" >/dev/null 2>&1 & done
  wait
  for c in $(cctr containers ls -q 2>/dev/null || true); do cctr containers delete "${c}" >/dev/null 2>&1 & done
  wait
  clog "killed and deleted $(wc -w <<<"${tasks}") pod container tasks"
fi
stop containerd
for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do
  stop "${c}"
done
clog "components stopped after ${SECONDS}s"

shim_sockets=()
# Whatever survived (containerd crashed, or a task would not die): the
# shims of this containerd, found by its socket on their command line, and
# every process in the pods' cgroups.
for d in /proc/[0-9]*; do
  pid=${d#/proc/}
  exe=$(readlink "${d}/exe" 2>/dev/null) || continue
  [[ "$(basename "${exe}")" == containerd-shim-runc-v2 ]] || continue
  cmdline=$(tr '\0' ' ' <"${d}/cmdline" 2>/dev/null) || continue
  grep -qF -- "-address ${CONTAINERD_SOCK} " <<<"${cmdline}" || continue
  clog "killing leftover shim ${pid}"
  kill -KILL "${pid}" 2>/dev/null || true
  # A killed shim leaves its socket in containerd's machine-wide
  # /run/containerd/s/, named sha256(<containerd socket>/<namespace>/<id>)
  # (pkg/shim.SocketAddress): remove exactly that one (and its debug twin).
  id=$(sed -nE 's/.* -id ([^ ]+) .*/\1/p' <<<"${cmdline}")
  ns=$(sed -nE 's/.* -namespace ([^ ]+) .*/\1/p' <<<"${cmdline}")
  if [[ -n "${id}" && -n "${ns}" ]]; then
    for suffix in "" "/debug"; do
      h=$(printf '%s' "${CONTAINERD_SOCK}/${ns}/${id}${suffix}" | sha256sum | cut -d' ' -f1)
      shim_sockets+=("/run/containerd/s/${h}")
    done
  fi
done
sleep 0.5
for f in "${shim_sockets[@]}"; do rm -f "${f}"; done
kill_pods
sleep 0.5
# Sandbox containers of this cluster's node left on the Docker Engine (the
# operator's labels; other nodes' containers are never touched).
if command -v docker >/dev/null; then
  left_sandboxes=$(docker ps -aq --filter "label=sandbox.code-sandbox.dev/managed-by=code-sandbox-operator" \
    --filter "label=sandbox.code-sandbox.dev/node=${CLUSTER_NODE_NAME}" 2>/dev/null || true)
  if [[ -n "${left_sandboxes}" ]]; then
    clog "removing $(wc -w <<<"${left_sandboxes}") sandbox container(s) of node ${CLUSTER_NODE_NAME} from Docker"
    docker rm -f ${left_sandboxes} >/dev/null 2>&1 || true
  fi
fi
# The kubelet's cgroups (cgroupfs driver): kubepods and below.
for ctl in /sys/fs/cgroup/*/; do
  [[ -d "${ctl}kubepods" ]] || continue
  find "${ctl}kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true
done

# Mounts under the cluster's directories (pod volumes, container root
# filesystems, /dev/shm of the sandboxes, network namespaces), deepest
# first.
for _ in 1 2 3; do
  mapfile -t mounts < <(awk -v s="${CLUSTER_STATE}" -v r="${CLUSTER_RUN}" \
    '{ p = $5; gsub(/\\040/, " ", p); if (index(p, s "/") == 1 || p == s || index(p, r "/") == 1 || p == r) print p }' \
    /proc/self/mountinfo | awk '{ print length($0) " " $0 }' | sort -rn | cut -d' ' -f2-)
  ((${#mounts[@]})) || break
  for m in "${mounts[@]}"; do
    umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || true
  done
done

# The pod network: veths on the bridge, then the bridge.
if ip link show "${CLUSTER_BRIDGE}" >/dev/null 2>&1; then
  for v in $(ip -o link show master "${CLUSTER_BRIDGE}" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
    ip link delete "${v}" 2>/dev/null || true
  done
  clog "removing ${CLUSTER_BRIDGE}"
  ip link delete "${CLUSTER_BRIDGE}" 2>/dev/null || true
fi

clog "processes, mounts and interfaces gone after ${SECONDS}s"
# iptables: kube-proxy removes its own chains; then whatever is left of
# KUBE-* (kubelet), CNI-* (the bridge plugin's ipMasq chains, which it
# names after the network and the container, and portmap's) and ours.
# Rules that jump to one of those go first; Docker's are never matched.
if [[ -x "${CLUSTER_BIN_DIR}/kube-proxy" ]]; then
  "${CLUSTER_BIN_DIR}/kube-proxy" --cleanup >/dev/null 2>&1 || true
fi
ours='^(KUBE-|CNI-|CSC-)'
for ipt in iptables ip6tables; do
  command -v "${ipt}" >/dev/null || continue
  for table in filter nat mangle raw; do
    "${ipt}" -t "${table}" -S >/dev/null 2>&1 || continue
    # Rules jumping to our chains, from any chain.
    while read -r rule; do
      [[ -n "${rule}" ]] || continue
      eval "\"${ipt}\" -t ${table} -D ${rule#-A }" 2>/dev/null || true
    done < <("${ipt}" -t "${table}" -S 2>/dev/null | grep -E -- '^-A [^ ]+ .*-j (KUBE-|CNI-|CSC-)')
    chains=$("${ipt}" -t "${table}" -S 2>/dev/null | awk '$1 == "-N" { print $2 }' | grep -E "${ours}" || true)
    for ch in ${chains}; do "${ipt}" -t "${table}" -F "${ch}" 2>/dev/null || true; done
    for ch in ${chains}; do "${ipt}" -t "${table}" -X "${ch}" 2>/dev/null || true; done
  done
done

# The kubelet's symlinks to pod logs (always under /var/log/containers).
if [[ -d /var/log/containers ]]; then
  find /var/log/containers -maxdepth 1 -type l -lname "${CLUSTER_STATE}/*" -delete 2>/dev/null || true
  rmdir /var/log/containers 2>/dev/null || true
fi

# The kernel tunables as they were before cluster-up.
if [[ -s "${CLUSTER_DIR}/sysctl.saved" ]]; then
  while IFS= read -r kv; do
    [[ -n "${kv}" ]] && sysctl -q -w "${kv}" >/dev/null 2>&1 || true
  done <"${CLUSTER_DIR}/sysctl.saved"
  rm -f "${CLUSTER_DIR}/sysctl.saved"
fi

rm -rf "${CLUSTER_STATE}" "${CLUSTER_RUN}"
rm -rf "${CLUSTER_PKI}" "${CLUSTER_PIDS}" "${CLUSTER_KUBECONFIG}" "${CLUSTER_DIR}"/*.yaml "${CLUSTER_DIR}"/*.toml
# The manager DaemonSet's hostPath, if the operator left it empty.
rmdir /var/lib/code-sandbox-operator 2>/dev/null || true

# Report anything left, so that a leak is visible rather than silent.
left=0
for c in "${CLUSTER_COMPONENTS[@]}"; do
  [[ -s "${CLUSTER_PIDS}/${c}.pid" ]] && { clog "left behind: ${c}"; left=1; }
done
if grep -qE " (${CLUSTER_STATE}|${CLUSTER_RUN})[/ ]" /proc/self/mountinfo; then
  clog "left behind: mounts under ${CLUSTER_STATE} or ${CLUSTER_RUN}"
  left=1
fi
if ip link show "${CLUSTER_BRIDGE}" >/dev/null 2>&1; then
  clog "left behind: ${CLUSTER_BRIDGE}"
  left=1
fi
if iptables-save 2>/dev/null | grep -qE -- '(^:|-j )(KUBE-|CNI-|CSC-)'; then
  clog "left behind: iptables chains:"
  iptables-save | grep -E -- '(^:|-j )(KUBE-|CNI-|CSC-)' >&2
  left=1
fi
# Not the cluster's: the operator's egress firewall, which its node manager
# installs on the host (hostNetwork) and keeps across restarts and
# undeploy. Other managers on this machine (test/e2e, make run) use the
# same chains, so they are left alone; say so.
if iptables-save 2>/dev/null | grep -q -- '^:CSBX-'; then
  clog "note: the operator's egress firewall chains (CSBX-*) remain; when no manager runs on this machine, remove them with: bin/manager --egress-cleanup (docs/deploy.md)"
fi
((left == 0)) && clog "stopped; nothing left behind"
exit "${left}"
