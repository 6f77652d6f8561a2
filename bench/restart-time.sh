#!/bin/sh
# Time from kill -9 of one of 4 workers under `gyre launch --max-restarts
# 1` to the restarted worker's first iteration in the job, per transport.
#   sh bench/restart-time.sh [RUNS] [TRANSPORTS]
# Each run starts `gyre launch -n 4 --max-restarts 1 -- train` on loopback,
# waits until it trains, kills launch index 2's worker with SIGKILL and
# polls (every 5 ms) the job's output for that index's next "joined at
# iteration N" line: it was admitted at the boundary of iteration N, and
# runs that iteration next. The time includes launch's 1 s backoff, the
# new process's start, its gossip join and its admission with the job's
# state. Then the medians per transport. RUNS defaults to 5, TRANSPORTS
# to "tcp quic"; the workers reach each other through shared memory
# unless SHM=off.
set -eu
cd "$(dirname "$0")/.."
runs=${1:-5}
transports=${2:-tcp quic}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
go build -o "$dir/gyre" ./cmd/gyre
gyre="$dir/gyre"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
joins() { grep -c '^\[2\] # rank [0-9]*/[0-9]* joined at iteration' "$dir/out" || true; }
for tr in $transports; do
  : >"$dir/$tr.runs"
  for run in $(seq "$runs"); do
    "$gyre" launch -n 4 --max-restarts 1 --transport "$tr" --shm "${SHM:-auto}" -- \
      train --iters 1000000 --target-acc 0 --eval-every 1000 >"$dir/out" 2>"$dir/err" &
    launch=$!
    until grep -q '^\[0\] *[0-9]* ' "$dir/out" && [ "$(joins)" -ge 1 ]; do
      kill -0 "$launch" 2>/dev/null || { echo "launch exited:"; cat "$dir/err"; exit 1; }
      sleep 0.05
    done
    sleep 1
    victim=
    for k in $(cat /proc/"$launch"/task/*/children); do
      if tr '\0' '\n' <"/proc/$k/environ" | grep -qx 'GYRE_LOCAL_RANK=2'; then victim=$k; fi
    done
    [ -n "$victim" ] || { echo "no worker of launch index 2"; exit 1; }
    killed=$(ms)
    kill -9 "$victim"
    until [ "$(joins)" -ge 2 ]; do
      kill -0 "$launch" 2>/dev/null || { echo "launch exited:"; cat "$dir/err"; exit 1; }
      sleep 0.005
    done
    took=$(( $(ms) - killed ))
    iter=$(grep '^\[2\] # rank [0-9]*/[0-9]* joined at iteration' "$dir/out" | tail -1 | sed 's/.*iteration \([0-9]*\).*/\1/')
    echo "$tr run $run: kill to the restarted worker's first iteration (admitted at iteration $iter): $took ms"
    echo "$took" >>"$dir/$tr.runs"
    kill -TERM "$launch"
    wait "$launch" || true
  done
done
for tr in $transports; do
  echo "$tr: median $(median <"$dir/$tr.runs") ms over $runs runs ($(sort -n "$dir/$tr.runs" | tr '\n' ' '))"
done
