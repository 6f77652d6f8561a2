#!/bin/bash
# One Gyre worker on this node of a Slurm job: what gyre.sbatch runs on
# every node, and what starts a lost worker again, by hand, inside the
# same job:
#   srun --jobid JOB --overlap -N1 -w NODE deploy/slurm/gyre-worker.sh
# Every node's address is a seed, the allocation's first node first: its
# worker is the starter (docs/deploy.md, "One command for every worker").
# ADDR overrides the address the node's name resolves to.
set -euo pipefail
GOSSIP_PORT=${GOSSIP_PORT:-7946}
seeds=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/\$/:$GOSSIP_PORT/" | paste -sd, -)
addr=${ADDR:-$(getent ahostsv4 "$SLURMD_NODENAME" | awk 'NR == 1 { print $1 }')}
case "$addr" in
"" | 127.*)
  echo "gyre-worker: $SLURMD_NODENAME resolves to '$addr', which the other nodes cannot reach; set ADDR" >&2
  exit 2
  ;;
esac
exec gyre train \
  --listen "$addr:$GOSSIP_PORT" \
  --seed "$seeds" \
  --key-file cluster.key \
  --min-workers "$SLURM_JOB_NUM_NODES" \
  --transport tcp \
  --checkpoint-dir checkpoints \
  --checkpoint-every 100 \
  --iters 20000 \
  --target-acc 0.97
