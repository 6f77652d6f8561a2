#!/bin/bash
# A real Slurm cluster on one machine, for testing deploy/slurm: a
# controller and three compute nodes (n1, n2, n3, two CPUs each), each
# daemon on a host of its own built from network namespaces by the
# namespace-cluster script ($CLUSTER_SH), and one munge daemon they share.
# Needs root, and Debian's slurmctld, slurmd, slurm-client and munge
# (`testbed.sh deps` installs them).
#
#   testbed.sh deps           install Slurm and munge (Debian)
#   testbed.sh up             start the cluster (after taking down anything left over)
#   testbed.sh run CMD...     run CMD on the controller's host with the cluster's
#                             configuration (sbatch, srun, squeue, scontrol)
#   testbed.sh down           stop every daemon and job, remove the hosts and every file
#
# Everything lives in $SLURM_TESTBED (default /tmp/gyre-slurm-testbed):
# the configuration, the spool and state directories, and the logs
# (logs/*.log). The hosts are $CLUSTER_SH's, under CLUSTER_ID (default
# 5), so the addresses are 10.77.ID.1-4. The workarounds below answer
# limits of running Slurm in namespaces of one machine, not anything a
# real cluster needs; each says which.
set -euo pipefail
export CLUSTER_ID=${CLUSTER_ID:-5}
cluster() {
  "${CLUSTER_SH:?set CLUSTER_SH to the namespace-cluster script}" "$@"
}
DIR=${SLURM_TESTBED:-/tmp/gyre-slurm-testbed}
V1_CGROUPS=$(cd "$(dirname "$0")/.." && pwd)/v1-cgroups.sh
NODES=3
CTL=$((NODES + 1)) # the controller's host
NET=10.77.$CLUSTER_ID
export SLURM_CONF=$DIR/slurm.conf

# Every namespace host gets its own /etc/hosts naming the others:
# `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts, so
# node names resolve without touching the machine's own. (Sandbox: no
# DNS for the hosts.)
nsname() { echo "gy${CLUSTER_ID}h$1"; }

# inhost I NAME CMD...: CMD on host I, in a UTS namespace of its own
# whose host name is NAME, since slurmd and slurmctld check their host
# name against slurm.conf (sandbox: the hosts share the machine's name),
# and with the cgroups slurmd needs (../v1-cgroups.sh says why).
inhost() {
  local i=$1 name=$2; shift 2
  cluster run "$i" unshare --uts --mount --propagation private "$V1_CGROUPS" -n "$name" "$@"
}

node_name() { if [ "$1" = "$CTL" ]; then echo ctl; else echo "n$1"; fi; }

down() {
  if [ -f "$DIR/munged.pid" ]; then kill "$(cat "$DIR/munged.pid")" 2>/dev/null || true; fi
  cluster down >/dev/null 2>&1 || true
  for i in $(seq 1 "$CTL"); do rm -rf "/etc/netns/$(nsname "$i")"; done
  rmdir /etc/netns 2>/dev/null || true
  rm -rf "$DIR"
}

cmd=${1:-}; shift || true
case "$cmd" in
deps)
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge
  ;;
up)
  for tool in slurmctld slurmd sbatch munged; do
    command -v "$tool" >/dev/null || { echo "testbed: no $tool (testbed.sh deps installs Slurm and munge)" >&2; exit 2; }
  done
  down
  cluster up "$CTL" >/dev/null
  mkdir -p "$DIR/logs" "$DIR/ctl" "$DIR/munge"
  for i in $(seq 1 "$CTL"); do
    mkdir -p "/etc/netns/$(nsname "$i")" "$DIR/n$i"
    {
      echo "127.0.0.1 localhost"
      for j in $(seq 1 "$CTL"); do echo "$NET.$j $(node_name "$j")"; done
    } >"/etc/netns/$(nsname "$i")/hosts"
  done
  # One munge daemon for every host, on a socket of the testbed's own:
  # a real cluster runs one per node, sharing a key.
  head -c 1024 /dev/urandom >"$DIR/munge/munge.key"
  chmod 0400 "$DIR/munge/munge.key"
  munged --force --key-file "$DIR/munge/munge.key" --socket "$DIR/munge/socket" \
    --pid-file "$DIR/munged.pid" --seed-file "$DIR/munge/seed" --log-file "$DIR/logs/munged.log" \
    </dev/null >>"$DIR/logs/start.log" 2>&1
  cat >"$SLURM_CONF" <<EOF
ClusterName=gyre
SlurmctldHost=ctl($NET.$CTL)
AuthType=auth/munge
AuthInfo=socket=$DIR/munge/socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/ctl
SlurmdSpoolDir=$DIR/%n
SlurmctldPidFile=$DIR/ctl/slurmctld.pid
SlurmdPidFile=$DIR/%n/slurmd.pid
SlurmctldLogFile=$DIR/logs/slurmctld.log
SlurmdLogFile=$DIR/logs/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=300
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=n[1-$NODES] NodeAddr=$NET.[1-$NODES] CPUs=2 State=UNKNOWN
PartitionName=main Nodes=n[1-$NODES] Default=YES MaxTime=INFINITE State=UP
EOF
  # The daemons' own output goes to a file: held open, a caller's pipe
  # would never close.
  inhost "$CTL" ctl slurmctld -i -f "$SLURM_CONF" </dev/null >>"$DIR/logs/start.log" 2>&1
  for i in $(seq 1 "$NODES"); do
    inhost "$i" "n$i" slurmd -f "$SLURM_CONF" -N "n$i" </dev/null >>"$DIR/logs/start.log" 2>&1
  done
  for _ in $(seq 1 300); do
    if [ "$(inhost "$CTL" ctl sinfo -h -N -t idle -o %N 2>/dev/null | wc -l)" = "$NODES" ]; then
      echo "testbed: Slurm up: ctl at $NET.$CTL, n1-n$NODES at $NET.1-$NODES ($SLURM_CONF)"
      exit 0
    fi
    sleep 0.1
  done
  echo "testbed: the nodes did not come up idle within 30 s:" >&2
  inhost "$CTL" ctl sinfo -N >&2 || true
  tail -n 20 "$DIR"/logs/*.log >&2 || true
  exit 1
  ;;
run)
  inhost "$CTL" ctl "$@"
  ;;
down)
  down
  echo "testbed: down"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | grep '^#' | cut -c3-
  exit 2
  ;;
esac
