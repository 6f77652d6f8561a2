#!/bin/sh
# Batch balancing on heterogeneous hosts: the issue's scenario.
#   sh bench/balance-cluster.sh "$CLUSTER_SH" [TRANSPORT]
# e.g.
#   ROUNDS=3 sh bench/balance-cluster.sh "$CLUSTER_SH" tcp
# On namespace hosts of the cluster script (root; README) capped at CAPS
# percent of a core (default 50,50,50,15; GOMAXPROCS=1), it runs
#   1. `gyre train --balance static` on all hosts, once;
#   2. ROUNDS rounds (default 1) of: one worker alone with each distinct
#      cap (the solo rates, whose sum over the hosts is the ideal), then
#      `gyre train` (LB-BSP) on all hosts, with host 1's cap dropped to
#      RECAP_TO percent (default 15) once rank 0 has finished RECAP_ITER
#      iterations (default 45; or RECAP_AFTER seconds after the start, if
#      set);
#   3. the solo runs once more,
# each writing rank 0's per-iteration metrics. Each round's ideal pools the
# solo runs just before and just after its LB-BSP job, so that the machine
# drifting between runs (it does, by 10-20% in minutes) moves the ideal
# and the job alike. `gyre bench balance` reports every round's shares,
# times and samples/s and its figures: steady-state rate against the ideal
# and against static, the largest share move, and how fast the shares
# settle after the cap change; the last lines give the median over rounds.
# TRANSPORT is tcp (TLS; default) or quic. MODEL sets gyre train's model
# and batch flags (default: an iteration of about 1 s of compute, and
# communication well under 5% of it). SOLO_ITERS sets the solo runs'
# iterations (default 8), LBBSP_ITERS the LB-BSP jobs' (default 80).
# OUT=DIR keeps the outputs.
set -eu
[ $# -ge 1 ] || { sed -n '2,27p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "balance-cluster: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$1
transport=${2:-tcp}
here=$(cd "$(dirname "$0")/.." && pwd)
recap_to=${RECAP_TO:-15} recap_iter=${RECAP_ITER:-45}
# The steady state is iterations 20 onward before the change.
[ "$recap_iter" -gt 25 ] && [ "$recap_iter" -lt "${LBBSP_ITERS:-80}" ] ||
  { echo "balance-cluster: RECAP_ITER must be over 25 (the steady state starts at 20) and below LBBSP_ITERS" >&2; exit 2; }
out=${OUT:-"$here/bench/out/balance-$(date -u +%Y%m%dT%H%M%SZ)-$transport"}
mkdir -p "$out"
caps=${CAPS:-50,50,50,15}
hosts=$(echo "$caps" | tr ',' '\n' | wc -l)
rounds=${ROUNDS:-1}
model=${MODEL:---hidden 2048 --batch 12288 --eval-every 100000 --target-acc 0}
train="train --transport $transport $model"
job() { # job NAME HOSTS CAPS ITERS [VAR=VALUE...]; train flags in $extra
  name=$1 n=$2 cpu=$3 iters=$4
  shift 4
  env OUT="$out/$name" CPU="$cpu" "$@" sh "$here/bench/cluster-job.sh" "$cluster" "$n" off \
    $train --iters "$iters" --metrics-file "$out/$name/metrics-@RANK@.jsonl" $extra > "$out/$name.txt" 2>&1 || {
    echo "balance-cluster: the $name job failed; see $out/$name.txt and $out/$name/" >&2
    exit 1
  }
}
# recap_at DIR: once rank 0 of the job writing DIR has finished
# recap_iter iterations (its --metrics-file has as many lines), set host
# 1's cap to recap_to and note when, as cluster-job.sh's RECAP does.
recap_at() {
  while [ "$(cat "$1/metrics-0.jsonl" 2>/dev/null | wc -l)" -lt "$recap_iter" ]; do sleep 0.2; done
  "$cluster" cpu 1 "$recap_to" && date +%s%N > "$1/recap.txt"
}
lbbsp() { # lbbsp NAME: the LB-BSP job with the cap change
  extra=""
  if [ -n "${RECAP_AFTER:-}" ]; then
    job "$1" "$hosts" "$caps" "${LBBSP_ITERS:-80}" RECAP="1:$recap_to:$RECAP_AFTER"
    return
  fi
  recap_at "$out/$1" &
  watcher=$!
  job "$1" "$hosts" "$caps" "${LBBSP_ITERS:-80}"
  kill "$watcher" 2>/dev/null || true
  [ -s "$out/$1/recap.txt" ] || { echo "balance-cluster: the $1 job ended before iteration $recap_iter" >&2; exit 1; }
}
solos() { # solos K: every distinct cap alone, as solo-K-CAP
  for cap in $(echo "$caps" | tr ',' '\n' | sort -u); do
    extra="--balance static"
    job "solo$1-$cap" 1 "$cap" "${SOLO_ITERS:-8}"
  done
}

extra="--balance static"
job static "$hosts" "$caps" 30
solos 1
for r in $(seq 1 "$rounds"); do
  lbbsp "lbbsp$r"
  solos $((r + 1))
done

: > "$out/summary.txt"
for r in $(seq 1 "$rounds"); do
  solo_flags=""
  for cap in $(echo "$caps" | tr ',' '\n'); do
    solo_flags="$solo_flags --solo $out/solo$r-$cap/metrics-0.jsonl,$out/solo$((r + 1))-$cap/metrics-0.jsonl"
  done
  changed=$(awk '{printf "%.3f", $1 / 1e9}' "$out/lbbsp$r/recap.txt")
  echo "## round $r"
  "$out/static/gyre" bench balance --run "lbbsp=$out/lbbsp$r/metrics-0.jsonl" --run "static=$out/static/metrics-0.jsonl" \
    $solo_flags --change-time "$changed" --json "$out/balance$r.json" --plot "$out/balance$r.png" | tee "$out/balance$r.txt"
  grep '^# \(solo rates\|lbbsp\|lbbsp / static\)' "$out/balance$r.txt" | sed "s/^# /round $r: /" >> "$out/summary.txt"
done
when="after iteration $recap_iter"
[ -z "${RECAP_AFTER:-}" ] || when="$RECAP_AFTER s in"
echo "## summary: hosts $hosts capped at $caps% of a core, GOMAXPROCS=1, transport $transport; host 1 to $recap_to% $when of each LB-BSP run"
cat "$out/summary.txt"
median() { sort -n | awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo "median over $rounds rounds: $(grep -o '[0-9.]* of ideal' "$out/summary.txt" | cut -d' ' -f1 | median) of ideal," \
  "lbbsp / static $(grep 'lbbsp / static' "$out/summary.txt" | awk '{print $NF}' | median)"
echo "outputs in $out" >&2
