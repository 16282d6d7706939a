#!/bin/bash
# Thaws every frozen cgroup of this node when it shuts down. Paused
# sandboxes (warm pool members, spec.paused) sit in the cgroup v1 freezer,
# and a frozen process cannot die: a real machine's shutdown gives up on
# them after systemd's timeout and the kernel reboots anyway, but a kind
# node is a container, which exits only when every process in it has, so
# `docker stop` of a node would hang for ever. Thawed, they die with the
# rest of the node.
for f in $(find /sys/fs/cgroup/freezer -name freezer.state 2>/dev/null); do
  if [ "$(cat "$f" 2>/dev/null)" != THAWED ]; then
    echo THAWED >"$f" 2>/dev/null || true
  fi
done
# cgroup v2: cgroup.freeze
for f in $(find /sys/fs/cgroup -name cgroup.freeze 2>/dev/null); do
  if [ "$(cat "$f" 2>/dev/null)" = 1 ]; then
    echo 0 >"$f" 2>/dev/null || true
  fi
done
exit 0
