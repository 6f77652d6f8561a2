#!/bin/sh
# v1-cgroups.sh [-n NAME] CMD...: run CMD with the cgroup v1 controllers
# mounted alone at /sys/fs/cgroup, in the mount namespace of the caller
# (which must be one of its own: unshare --mount --propagation private),
# for the deploy testbeds (deploy/slurm/testbed.sh, deploy/image/testbed.sh).
# With -n, also set the host name (the caller must unshare --uts too).
#
# Sandbox limits it answers, not anything a real host needs: `ip netns
# exec` remounts /sys, which hides /sys/fs/cgroup, and slurmd and crun
# need it; this machine mounts a v2 hierarchy beside the v1 ones
# (/sys/fs/cgroup/unified), which crun refuses ("cgroups in hybrid mode
# not supported"); slurmd also needs the name=systemd hierarchy.
set -eu
if [ "${1:-}" = -n ]; then
  hostname "$2"
  shift 2
fi
umount /sys/fs/cgroup/unified 2>/dev/null || true
if [ ! -d /sys/fs/cgroup/cpu ]; then
  mount -t tmpfs cgroup /sys/fs/cgroup
  for c in cpu cpuacct cpuset memory devices freezer pids none,name=systemd; do
    d=/sys/fs/cgroup/${c#none,name=}
    mkdir -p "$d"
    mount -t cgroup -o "$c" cgroup "$d" 2>/dev/null || rmdir "$d"
  done
fi
exec "$@"
