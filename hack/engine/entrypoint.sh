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
#     dockerd starts in the cgroup ENGINE_CGROUP_PARENT at the root of
#     every cgroup v1 hierarchy (mounted over /sys/fs/cgroup), so that
#     dockerd, containerd, the shims and the sandboxes (cgroup parent
#     ENGINE_CGROUP_PARENT) are not in this container's cgroup, which the
#     runtime kills when the Pod stops. Stopping the Pod then stops only
#     dockerd (SIGTERM below; a dockerd that outlives a Pod killed hard is
#     stopped by the next Engine Pod): with live-restore the sandboxes keep
#     running, and the next Engine Pod takes them over. Without it every
#     sandbox dies with the Pod.
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
  local ids ctrls opts dir n names
  # /proc/self/cgroup: "ID:controllers:path"; ID 0 is cgroup v2.
  if ! grep -qv '^0::' /proc/self/cgroup; then
    log "ENGINE_DETACH needs cgroup v1 (this node runs cgroup v2 only): set ENGINE_DETACH=false, and the sandboxes stop with this Pod"
    return 1
  fi
  local cgroups hybrid=0
  cgroups=$(grep -v '^0::' /proc/self/cgroup)
  grep -q '^0::' /proc/self/cgroup && hybrid=1
  # Replace the runtime's /sys/fs/cgroup, which holds bind mounts of this
  # container's part of each hierarchy: the kernel refuses to mount a
  # hierarchy over its own bind mount, and runc would find the covered
  # mounts in mountinfo.
  umount -R /sys/fs/cgroup 2>/dev/null || umount -R -l /sys/fs/cgroup 2>/dev/null || true
  if ! mount -t tmpfs -o mode=0755,nosuid,nodev,noexec cgroup /sys/fs/cgroup; then
    log "mounting a tmpfs on /sys/fs/cgroup failed (is the Pod privileged?)"
    return 1
  fi
  while IFS=: read -r ids ctrls _; do
    [[ -z "${ctrls}" ]] && continue
    case "${ctrls}" in
      name=*) opts="none,${ctrls}" dir="/sys/fs/cgroup/${ctrls#name=}" ;;
      *) opts="${ctrls}" dir="/sys/fs/cgroup/${ctrls}" ;;
    esac
    # The node's whole hierarchy: cgroup v1 has no cgroup namespace.
    mkdir -p "${dir}"
    if ! mount -t cgroup -o "${opts}" cgroup "${dir}"; then
      log "mounting the ${ctrls} cgroup hierarchy failed"
      return 1
    fi
    mkdir -p "${dir}${CGROUP_PARENT}"
    if [[ ",${ctrls}," == *,cpuset,* ]]; then
      for f in cpuset.cpus cpuset.mems; do
        [[ -n "$(cat "${dir}${CGROUP_PARENT}/${f}")" ]] || cat "${dir}/${f}" >"${dir}${CGROUP_PARENT}/${f}"
      done
    fi
    cgroup_procs+=("${dir}${CGROUP_PARENT}/cgroup.procs")
    # Controllers mounted together (cpu,cpuacct) also appear under each
    # single name; dockerd looks them up by name.
    IFS=, read -r -a names <<<"${ctrls}"
    if ((${#names[@]} > 1)); then
      for n in "${names[@]}"; do
        [[ -e "/sys/fs/cgroup/${n}" ]] || ln -s "${ctrls}" "/sys/fs/cgroup/${n}"
      done
    fi
  done <<<"${cgroups}"
  # Hybrid nodes (systemd's unified hierarchy beside the v1 controllers,
  # as on kind): systemd and runc's systemd driver find a scope's
  # processes there, so the Pod's scope would still hold dockerd's and the
  # runtime would kill them with the Pod.
  if ((hybrid)); then
    dir=/sys/fs/cgroup/unified
    mkdir -p "${dir}"
    if ! mount -t cgroup2 -o nsdelegate cgroup2 "${dir}" 2>/dev/null && ! mount -t cgroup2 cgroup2 "${dir}"; then
      log "mounting the unified cgroup hierarchy failed"
      return 1
    fi
    mkdir -p "${dir}${CGROUP_PARENT}"
    cgroup_procs+=("${dir}${CGROUP_PARENT}/cgroup.procs")
  fi
  mount -o remount,ro /sys/fs/cgroup 2>/dev/null || true
  log "detached: dockerd and its containers run in ${CGROUP_PARENT} of the node's cgroup hierarchies"
}

cgroup_parent_arg=()
# The cgroup.procs files dockerd moves itself to before it starts (this
# script stays in the Pod's cgroup, so that it dies with the Pod).
cgroup_procs=()
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
# The shims (children of containerd, of dockerd) outlive this container,
# whose root file system is removed with the Pod: their temporary files
# (runc's process specs for every exec) must be on the node.
export TMPDIR="${exec_root}/tmp"
mkdir -p "${TMPDIR}"
chmod 0700 "${TMPDIR}"

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

# stop_stale stops the dockerd of a previous Engine Pod that is still
# running: detached from its Pod's cgroup and PID namespace, it outlives a
# Pod killed before it could stop dockerd (grace period exceeded, SIGKILL).
# Two dockerds on one data root would corrupt it. SIGTERM: live-restore
# keeps the containers for us.
stop_stale() {
  local pidfile="${exec_root}/dockerd.pid" pid i
  [[ -s "${pidfile}" ]] || return 0
  pid=$(<"${pidfile}")
  if [[ "${pid}" =~ ^[0-9]+$ && "$(cat "/proc/${pid}/comm" 2>/dev/null)" == dockerd ]] &&
    tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -q -- "--pidfile ${pidfile}"; then
    log "stopping the previous Engine's dockerd (PID ${pid}), still running"
    kill -TERM "${pid}" 2>/dev/null
    for ((i = 0; i < 60; i++)); do
      [[ -d "/proc/${pid}" ]] || break
      sleep 0.5
    done
    if [[ -d "/proc/${pid}" ]]; then
      log "the previous dockerd (PID ${pid}) did not stop in 30s; killing it"
      kill -KILL "${pid}" 2>/dev/null
      sleep 1
    fi
  fi
  rm -f "${pidfile}"
}

backoff=1
while ((!stopping)); do
  stop_stale
  started=${SECONDS}
  (
    for f in "${cgroup_procs[@]}"; do
      echo "${BASHPID}" >"${f}" || { log "moving dockerd to ${f%/cgroup.procs} failed"; exit 1; }
    done
    exec dockerd --config-file "${CONFIG}" --pidfile "${exec_root}/dockerd.pid" "${cgroup_parent_arg[@]}" "$@"
  ) &
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
