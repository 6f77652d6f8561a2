#!/bin/sh
# LB-BSP against static shares with a compiled framework: the GoMLX MNIST
# trainer (examples/gomlx) on namespace hosts of unequal CPU.
#   sh bench/gomlx-balance-cluster.sh "$CLUSTER_SH" [TRANSPORT]
# e.g.
#   ROUNDS=3 sh bench/gomlx-balance-cluster.sh "$CLUSTER_SH" quic
# On hosts of the cluster script (root; README) capped at CAPS percent of
# a core (default 45,45,45,15; GOMAXPROCS=1), it runs ROUNDS rounds
# (default 3) of: the trainer with --balance static, then with LB-BSP,
# ITERS iterations each (default 40) at global batch 256, and reads rank
# 0's job throughput (samples/s after 5 warm-up iterations). It prints
# each round's rates and ratio, and the medians. The ideal ratio is the
# sum of the caps over 4 times the smallest: 2.5 with the defaults.
# EXTRA adds trainer flags (e.g. EXTRA="--bucket 8"); OUT=DIR keeps the
# outputs.
set -eu
[ $# -ge 1 ] || { sed -n '2,16p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "gomlx-balance-cluster: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$1
transport=${2:-quic}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-"$here/bench/out/gomlx-balance-$(date -u +%Y%m%dT%H%M%SZ)-$transport"}
mkdir -p "$out"
caps=${CAPS:-45,45,45,15}
hosts=$(echo "$caps" | tr ',' '\n' | wc -l)
(cd "$here/examples/gomlx" && CGO_ENABLED=0 go build -o "$out/gomlx-mnist" ./cmd/gomlx-mnist)

job() { # job NAME BALANCE
  OUT="$out/$1" CPU="$caps" PROGRAM="$out/gomlx-mnist" sh "$here/bench/cluster-job.sh" "$cluster" "$hosts" off \
    --transport "$transport" --balance "$2" --batch 256 --iters "${ITERS:-40}" --target 0 \
    --eval-every 100000 ${EXTRA:-} > "$out/$1.txt" 2>&1 || {
    echo "gomlx-balance-cluster: the $1 job failed; see $out/$1.txt and $out/$1/" >&2
    exit 1
  }
  grep -o 'job throughput [0-9.]*' "$out/$1/rank0.txt" | awk '{print $3}'
}
: > "$out/summary.txt"
for r in $(seq 1 "${ROUNDS:-3}"); do
  static=$(job "static$r" static)
  lbbsp=$(job "lbbsp$r" lbbsp)
  echo "round $r: static $static samples/s, lbbsp $lbbsp samples/s, lbbsp / static $(echo "$lbbsp / $static" | bc -l | cut -c1-5)" |
    tee -a "$out/summary.txt"
done
median() { sort -n | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "## hosts $hosts capped at $caps% of a core, GOMAXPROCS=1, transport $transport, global batch 256, ${ITERS:-40} iterations"
echo "median static $(awk '{print $4}' "$out/summary.txt" | median) samples/s, lbbsp $(awk '{print $7}' "$out/summary.txt" | median) samples/s," \
  "lbbsp / static $(awk '{print $NF}' "$out/summary.txt" | median) (median of per-round ratios)"
echo "outputs in $out" >&2
