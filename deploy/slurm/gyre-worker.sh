#!/bin/bash
# One Gyre worker on this node of a Slurm job: what gyre.sbatch runs on
# every node, and what starts a lost worker again, by hand, inside the
# same job, from the job's working directory and with the job's
# arguments:
#   srun --jobid JOB --overlap -N1 -w NODE deploy/slurm/gyre-worker.sh [ARGS]
# Every node's address is a seed, the allocation's first node first: its
# worker is the starter (docs/deploy.md, "One command for every worker").
# ARGS are more gyre train flags; they override the ones below.
# ADDR overrides the address the node's name resolves to.
#
# The allocation's nodes come from SLURM_NODELIST, which every step of
# the job sees whole. SLURM_JOB_NODELIST and SLURM_NNODES do not serve:
# in a step started later with srun --jobid -w NODE they name that one
# node, and SLURM_JOB_NUM_NODES is not set there at all.
set -euo pipefail
GOSSIP_PORT=${GOSSIP_PORT:-7946}
nodes=$(scontrol show hostnames "${SLURM_NODELIST:?not in a Slurm job step}")
seeds=$(sed "s/\$/:$GOSSIP_PORT/" <<<"$nodes" | paste -sd, -)
node_count=$(wc -l <<<"$nodes")
addr=${ADDR:-$(getent ahostsv4 "$SLURMD_NODENAME" | awk 'NR == 1 { print $1 }')}
case "$addr" in
"" | 127.*)
  echo "gyre-worker: $SLURMD_NODENAME resolves to '$addr', which the other nodes cannot reach; set ADDR" >&2
  exit 2
  ;;
esac

# gyre runs as a child, not exec'd, so that a worker that finishes the
# job can say so: gyre.sbatch reads the marker to tell a job that
# recovered from a lost worker (srun fails) from one that failed. Slurm
# signals every process of the step; the trap passes on a signal sent to
# this script alone. A worker asked to leave also exits 0, without
# finishing the job: it leaves no marker.
left='' worker=''
trap 'left=1; if [ -n "$worker" ]; then kill -TERM "$worker" 2>/dev/null || true; fi' TERM INT
gyre train \
  --listen "$addr:$GOSSIP_PORT" \
  --seed "$seeds" \
  --key-file cluster.key \
  --min-workers "$node_count" \
  --transport tcp \
  --checkpoint-dir checkpoints \
  --checkpoint-every 100 \
  --iters 20000 \
  --target-acc 0.97 \
  "$@" &
worker=$!
if [ -n "$left" ]; then kill -TERM "$worker" 2>/dev/null || true; fi
# A trapped signal cuts a wait short; the worker's status is the wait
# after it has exited (the shell keeps it).
while kill -0 "$worker" 2>/dev/null; do wait "$worker" || true; done
status=0
wait "$worker" || status=$?
if [ "$status" = 0 ] && [ -z "$left" ]; then
  touch ".gyre-finished-$SLURM_JOB_ID"
fi
exit "$status"
