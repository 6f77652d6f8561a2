#!/bin/sh
# Batch balancing on heterogeneous hosts: the issue's scenario.
#   sh bench/balance-cluster.sh CLUSTER_SH [TRANSPORT]
# e.g.
#   sh bench/balance-cluster.sh ../shared/cluster/cluster.sh tcp
# On namespace hosts of the cluster script (it needs root) capped at CAPS
# percent of a core (default 50,50,50,15; GOMAXPROCS=1), it runs
#   1. one worker alone with each distinct cap (the solo rates; their sum
#      over the hosts is the ideal),
#   2. `gyre train --balance static` on all hosts,
#   3. `gyre train` (LB-BSP) on all hosts, with host 1's cap dropped to
#      RECAP_TO percent (default 15) RECAP_AFTER seconds in (default 55),
# each writing rank 0's per-iteration metrics, then `gyre bench balance`
# reports every iteration's shares, time and samples/s and the figures:
# steady-state rate against the ideal and against static, the largest
# share move, and how fast the shares settle after the cap change.
# TRANSPORT is tcp (TLS; default) or quic. MODEL sets gyre train's model
# and batch flags (default: an iteration of about 1 s of compute, and
# communication well under 5% of it). SOLO_ITERS sets the solo runs'
# iterations (default 8). OUT=DIR keeps the outputs.
set -eu
[ $# -ge 1 ] || { sed -n '2,20p' "$0" | cut -c3- >&2; exit 2; }
cluster=$1
transport=${2:-tcp}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-"$here/bench/out/balance-$(date -u +%Y%m%dT%H%M%SZ)-$transport"}
mkdir -p "$out"
caps=${CAPS:-50,50,50,15}
hosts=$(echo "$caps" | tr ',' '\n' | wc -l)
model=${MODEL:---hidden 2048 --batch 12288 --eval-every 100000 --target-acc 0}
train="train --transport $transport $model"
job() { # job NAME HOSTS CAPS ITERS [VAR=VALUE...] -- [train flags]
  name=$1 n=$2 cpu=$3 iters=$4
  shift 4
  env OUT="$out/$name" CPU="$cpu" "$@" sh "$here/bench/cluster-job.sh" "$cluster" "$n" off \
    $train --iters "$iters" --metrics-file "$out/$name/metrics-@RANK@.jsonl" $extra > "$out/$name.txt" 2>&1 || {
    echo "balance-cluster: the $name job failed; see $out/$name.txt and $out/$name/" >&2
    exit 1
  }
}
solos=""
for cap in $(echo "$caps" | tr ',' '\n' | sort -u); do
  extra="--balance static"
  job "solo$cap" 1 "$cap" "${SOLO_ITERS:-8}"
  solos="$solos solo$cap"
done
extra="--balance static"
job static "$hosts" "$caps" 30
extra=""
job lbbsp "$hosts" "$caps" 80 RECAP="1:${RECAP_TO:-15}:${RECAP_AFTER:-55}"

solo_flags=""
for cap in $(echo "$caps" | tr ',' '\n'); do
  solo_flags="$solo_flags --solo $out/solo$cap/metrics-0.jsonl"
done
changed=$(awk '{printf "%.3f", $1 / 1e9}' "$out/lbbsp/recap.txt")
"$out/lbbsp/gyre" bench balance --run "lbbsp=$out/lbbsp/metrics-0.jsonl" --run "static=$out/static/metrics-0.jsonl" \
  $solo_flags --change-time "$changed" --json "$out/balance.json" | tee "$out/balance.txt"
echo "# hosts $hosts capped at $caps% of a core, GOMAXPROCS=1, transport $transport; host 1 to ${RECAP_TO:-15}% after ${RECAP_AFTER:-55} s of the lbbsp run"
echo "outputs in $out" >&2
