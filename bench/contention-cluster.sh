#!/bin/sh
# How much the heterogeneity scenario's hosts slow each other down: the
# reachable ceiling for balancing on this machine.
#   sh bench/contention-cluster.sh "$CLUSTER_SH"
# The heterogeneity figure compares LB-BSP with the sum of each host's
# solo rate, each measured with the machine to itself. Namespace hosts
# share the machine's cores, caches and memory bandwidth, so this script
# runs the same solo workers (one worker computing the whole global batch
# at its host's cap, GOMAXPROCS=1, no communication) first one at a time
# and then all at once, each in a cluster of its own (CLUSTER_ID 1 to N),
# and prints every host's median rate alone and together, and the sums.
# CAPS (default 50,50,50,15), MODEL (default balance-cluster.sh's) and
# ITERS (default 6; the first 2 are dropped) as in balance-cluster.sh.
# OUT=DIR keeps the outputs. It needs root, as the cluster script does.
set -eu
[ $# -ge 1 ] || { sed -n '2,14p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "contention-cluster: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$1
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-"$here/bench/out/contention-$(date -u +%Y%m%dT%H%M%SZ)"}
mkdir -p "$out"
caps=${CAPS:-50,50,50,15}
model=${MODEL:---hidden 2048 --batch 12288 --eval-every 100000 --target-acc 0}
iters=${ITERS:-6}
solo() { # solo NAME HOST_INDEX CAP
  env OUT="$out/$1" CPU="$3" CLUSTER_ID="$2" sh "$here/bench/cluster-job.sh" "$cluster" 1 off \
    train --balance static $model --iters "$iters" --metrics-file "$out/$1/metrics-@RANK@.jsonl" > "$out/$1.txt" 2>&1 || {
    echo "contention-cluster: $1 failed; see $out/$1.txt" >&2
    exit 1
  }
}
# rate FILE: the median samples/s of iterations 2 onward.
rate() {
  sed -n 's/.*"iter":\([0-9]*\).*"samples_per_sec":\([0-9.e+]*\).*/\1 \2/p' "$1" | awk '$1 >= 2 { print $2 }' | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print 0; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
i=0
for cap in $(echo "$caps" | tr ',' ' '); do
  i=$((i + 1))
  solo "alone$i" "$i" "$cap"
done
i=0
pids=""
for cap in $(echo "$caps" | tr ',' ' '); do
  i=$((i + 1))
  solo "together$i" "$i" "$cap" &
  pids="$pids $!"
done
for p in $pids; do wait "$p"; done
i=0
{
  echo "# hosts capped at $caps% of a core, GOMAXPROCS=1, gyre train $model, $iters iterations (median of 2 onward)"
  printf "%-6s %5s %12s %12s %8s\n" host cap alone together ratio
  for cap in $(echo "$caps" | tr ',' ' '); do
    i=$((i + 1))
    a=$(rate "$out/alone$i/metrics-0.jsonl") t=$(rate "$out/together$i/metrics-0.jsonl")
    printf "%-6s %5s %12.0f %12.0f %8.3f\n" "$i" "$cap%" "$a" "$t" "$(echo "$t $a" | awk '{print $1 / $2}')"
    echo "$a $t" >> "$out/sums.txt"
  done
  awk '{ a += $1; t += $2 } END { printf "%-6s %5s %12.0f %12.0f %8.3f\n", "sum", "", a, t, t / a }' "$out/sums.txt"
} | tee "$out/summary.txt"
echo "outputs in $out" >&2
