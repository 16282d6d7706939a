#!/bin/bash
# The Engine image's entrypoint (config/engine): prepares the node for a
# Docker Engine that outlives this container, then runs dockerd and
# restarts it when it exits.
#
#  1. iptables backend. dockerd, the manager's egress firewall and the
#     node's kube-proxy must write the same one (nf_tables or legacy x_tables),
#     or rules land in a ruleset nobody evaluates together with the others
#     and the egress firewall silently filters nothing. ENGINE_IPTABLES_MODE
#     is auto (default), nft or legacy; auto chooses as the manager's
#     --egress-iptables-mode=auto and Kubernetes' iptables-wrapper do: the
#     ruleset holding Docker's chains (a previous Engine's), else kubelet's
#     hint chains, else the one with more rules, else nft.
#  2. Detaching (ENGINE_DETACH=true, the DaemonSet's setting, with hostPID):
#     this process moves to the cgroup ENGINE_CGROUP_PARENT at the root of
#     every cgroup v1 hierarchy, and mounts those hierarchies over
#     /sys/fs/cgroup, so that dockerd, containerd, the shims and the
#     sandboxes (cgroup parent ENGINE_CGROUP_PARENT) are not in this
#     container's cgroup. Stopping this container then stops only dockerd:
#     with live-restore the sandboxes keep running, and the next Engine Pod
#     picks them up again. Without it every sandbox dies with the Pod.
#  3. dockerd with /etc/docker/daemon.json (socket, data root, exec root,
#     live-restore, address pools), restarted when it exits on its own;
#     SIGTERM stops it (live-restore keeps the containers) and exits.
set -uo pipefail

log() { echo "engine: $*" >&2; }

MODE="${ENGINE_IPTABLES_MODE:-auto}"
DETACH="${ENGINE_DETACH:-false}"
CGROUP_PARENT="${ENGINE_CGROUP_PARENT:-/code-sandbox-engine}"
CONFIG=/etc/docker/daemon.json

# --- 1. iptables backend ------------------------------------------------

# survey MODE prints "<docker> <kubelet> <rules>" for iptables-MODE-save.
survey() {
  local out docker=0 kubelet=0 rules=0
  out=$( (timeout 10 "iptables-$1-save"; timeout 10 "ip6tables-$1-save") 2>/dev/null) || true
  grep -qE '^:(DOCKER|DOCKER-USER|DOCKER-ISOLATION-STAGE-1) ' <<<"${out}" && docker=1
  grep -qE '^:(KUBE-IPTABLES-HINT|KUBE-KUBELET-CANARY) ' <<<"${out}" && kubelet=1
  rules=$(grep -c '^-' <<<"${out}")
  echo "${docker} ${kubelet} ${rules}"
}

choose_mode() {
  local n l
  read -r -a n < <(survey nft)
  read -r -a l < <(survey legacy)
  if ((n[0] != l[0])); then
    ((n[0])) && echo "nft Docker's chains are in the nf_tables ruleset" || echo "legacy Docker's chains are in the legacy ruleset"
  elif ((n[1] != l[1])); then
    ((n[1])) && echo "nft kubelet's hint chain is in the nf_tables ruleset" || echo "legacy kubelet's hint chain is in the legacy ruleset"
  elif ((l[2] > n[2])); then
    echo "legacy the legacy ruleset holds more rules (${l[2]} > ${n[2]})"
  else
    echo "nft the default (nf_tables ${n[2]} rules, legacy ${l[2]})"
  fi
}

case "${MODE}" in
  auto) read -r MODE why < <(choose_mode) ;;
  nft | legacy) why="ENGINE_IPTABLES_MODE=${MODE}" ;;
  *)
    log "ENGINE_IPTABLES_MODE=${MODE}: want auto, nft or legacy"
    exit 2
    ;;
esac
for t in iptables ip6tables; do
  update-alternatives --quiet --set "${t}" "/usr/sbin/${t}-${MODE}" || {
    log "cannot select ${t}-${MODE}"
    exit 1
  }
done
log "iptables backend: ${MODE} (${why})"

# --- 2. detach from this container's cgroup -----------------------------

detach() {
  local line ids ctrls opts dir
  # /proc/self/cgroup: "ID:controllers:path"; ID 0 is cgroup v2.
  if grep -q '^0::' /proc/self/cgroup && [[ $(wc -l </proc/self/cgroup) -eq 1 ]]; then
    log "ENGINE_DETACH needs cgroup v1 (this node runs cgroup v2 only); the sandboxes stop with this Pod"
    return 1
  fi
  while IFS=: read -r ids ctrls _; do
    [[ "${ids}" == 0 || -z "${ctrls}" ]] && continue
    case "${ctrls}" in
      name=*) opts="none,${ctrls}" dir="/sys/fs/cgroup/${ctrls#name=}" ;;
      *) opts="${ctrls}" dir="/sys/fs/cgroup/${ctrls}" ;;
    esac
    # The node's whole hierarchy (cgroup v1 has no cgroup namespace), over
    # the runtime's bind mount of this container's part of it.
    mkdir -p "${dir}"
    if ! mount -t cgroup -o "${opts}" cgroup "${dir}"; then
      log "mounting the ${ctrls} cgroup hierarchy failed (is the Pod privileged?)"
      return 1
    fi
    mkdir -p "${dir}${CGROUP_PARENT}"
    [[ "${ctrls}" == *cpuset* ]] && for f in cpuset.cpus cpuset.mems; do
      [[ -s "${dir}${CGROUP_PARENT}/${f}" ]] || cat "${dir}/${f}" >"${dir}${CGROUP_PARENT}/${f}"
    done
    if ! echo $$ >"${dir}${CGROUP_PARENT}/cgroup.procs"; then
      log "moving to ${dir}${CGROUP_PARENT} failed"
      return 1
    fi
    # Controllers mounted together (cpu,cpuacct) also appear under each
    # single name; dockerd looks them up by name.
    IFS=, read -r -a names <<<"${ctrls}"
    if ((${#names[@]} > 1)); then
      for n in "${names[@]}"; do
        [[ -e "/sys/fs/cgroup/${n}" ]] || ln -s "${ctrls}" "/sys/fs/cgroup/${n}"
      done
    fi
  done </proc/self/cgroup
  log "detached: this Engine runs in ${CGROUP_PARENT} of the node's cgroup hierarchies"
}

cgroup_parent_arg=()
case "${DETACH}" in
  true)
    # In a PID namespace of its own, this script or tini (its parent) is
    # PID 1, whose exit kills every process in the namespace.
    if [[ $$ -eq 1 || ${PPID} -eq 1 ]]; then
      log "ENGINE_DETACH=true needs the node's PID namespace (hostPID: true)"
      exit 1
    fi
    detach || exit 1
    cgroup_parent_arg=(--cgroup-parent "${CGROUP_PARENT}")
    ;;
  false) ;;
  *)
    log "ENGINE_DETACH=${DETACH}: want true or false"
    exit 2
    ;;
esac

# --- 3. run dockerd -----------------------------------------------------

# Kernel modules dockerd needs; on most nodes they are built in or loaded
# already (/lib/modules is mounted from the node when present).
for m in overlay br_netfilter; do modprobe -q "${m}" 2>/dev/null || true; done

sock=$(sed -n 's#.*"unix://\([^"]*\)".*#\1#p' "${CONFIG}" | head -n1)
exec_root=$(sed -n 's#.*"exec-root": *"\([^"]*\)".*#\1#p' "${CONFIG}")
mkdir -p "$(dirname "${sock}")" "${exec_root}"

child=
stopping=0
on_term() {
  stopping=1
  if [[ -n "${child}" ]]; then
    log "stopping dockerd (live-restore keeps the containers running)"
    kill -TERM "${child}" 2>/dev/null
  fi
}
trap on_term TERM INT

backoff=1
while ((!stopping)); do
  # A dockerd killed hard leaves its pid file; this DaemonSet runs one
  # Engine per node, so it is stale.
  rm -f "${exec_root}/dockerd.pid"
  started=${SECONDS}
  dockerd --config-file "${CONFIG}" --pidfile "${exec_root}/dockerd.pid" "${cgroup_parent_arg[@]}" "$@" &
  child=$!
  # wait returns early when a trapped signal arrives; wait again for the
  # exit status.
  while kill -0 "${child}" 2>/dev/null; do wait "${child}"; done
  wait "${child}" 2>/dev/null
  rc=$?
  child=
  ((stopping)) && break
  if ((SECONDS - started > 60)); then backoff=1; fi
  log "dockerd exited with status ${rc}; restarting in ${backoff}s"
  sleep "${backoff}" &
  wait $! || true
  backoff=$((backoff < 16 ? backoff * 2 : 30))
done
log "stopped"
