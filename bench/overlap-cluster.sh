#!/bin/sh
# The overlap scenario on two hosts of the namespace cluster: one worker of
# `gyre bench overlap` per host, each host's link capped so that transfers
# are link-bound, not CPU-bound.
#   sh bench/overlap-cluster.sh "$CLUSTER_SH" [RATE] [gyre bench overlap flags...]
# e.g.
#   sh bench/overlap-cluster.sh "$CLUSTER_SH"
#   sh bench/overlap-cluster.sh "$CLUSTER_SH" 100mbit --batch 3072 --iters 20
# CLUSTER_SH is the namespace-cluster script (root; README). RATE caps
# both hosts' links both ways (tc tbf; default 50mbit; may be left out
# before flags), which with the default model puts communication at
# 0.5-1.0x the backward pass. The flags go to both workers (--hidden,
# --batch, --bucket-bytes, --iters, -w, --transport, ...). CLUSTER_ID=K
# (0-9) picks the cluster; runs with the same id must not overlap.
#
# bench/cluster-job.sh does the work: it brings up the hosts, starts one
# worker on each, prints rank 0's table and tears the cluster down. The
# outputs, with the --json report, go to bench/out/overlap-cluster-TIMESTAMP/.
set -eu
[ $# -ge 1 ] || { sed -n '2,18p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "overlap-cluster: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$1; shift
# RATE may be left out: a first argument starting with '-' is a flag.
rate=50mbit
case "${1:-}" in ''|-*) ;; *) rate=$1; shift ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
OUT="$here/bench/out/overlap-cluster-$(date -u +%Y%m%dT%H%M%SZ)"
export OUT
exec sh "$here/bench/cluster-job.sh" "$cluster" 2 "$rate" bench overlap --json "$OUT/overlap.json" "$@"
