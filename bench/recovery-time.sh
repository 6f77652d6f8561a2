#!/bin/sh
# Time from kill -9 of one of 4 workers to Boundary returning Redo on the
# last survivor, per transport, split by phase.
#   sh bench/recovery-time.sh [RUNS] [TRANSPORTS] [MODE]
# MODE kill (the default): each run starts `gyre launch -n 4 ... train` on
# loopback with JSON logs, waits until it trains, kills one worker with
# SIGKILL and waits for the 3 survivors' "recovered" log lines. It prints,
# per run, the time from the kill to the last survivor's line (polled
# every 5 ms), and that survivor's phases as it logged them: detect (from
# the lost worker's last heartbeat to entering a round), agree (the
# rounds, to the install) and transfer (connecting the new view and
# taking the winning state). Then the medians per transport.
# MODE probe: a kill as the link probes begin. Each run starts 4 workers
# by hand (README's recipe: a seed with --min-workers 4, three joiners),
# one with GYRE_FAILPOINT=probe@1000, which dies as kill -9 would when
# the re-probe at iteration 1000 begins. A kill from outside cannot aim
# at that moment, so the time is the survivors' own: the largest "total"
# of their "recovered" lines, from the lost worker's last heartbeat to
# the install (PROBE_FAILPOINT replaces the failpoint: before the probe
# failpoint counted the probes' iteration, 9c74189 and earlier needed
# probe@999). RUNS defaults to 5, TRANSPORTS to "tcp quic". The workers
# reach each other through shared memory unless SHM=off.
set -eu
cd "$(dirname "$0")/.."
runs=${1:-5}
transports=${2:-tcp quic}
mode=${3:-kill}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
go build -o "$dir/gyre" ./cmd/gyre
gyre="$dir/gyre"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
field() { sed -n "s/.*\"$1\":\([0-9.]*\).*/\1/p"; }
median() { sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
if [ "$mode" = probe ]; then
  "$gyre" keygen --out "$dir/key" >/dev/null 2>&1
  for tr in $transports; do
    : >"$dir/$tr.runs"
    for run in $(seq "$runs"); do
      rm -f "$dir"/w*.err
      port=$((27000 + run * 100))
      pids= survivors=
      for i in 0 1 2 3; do
        set -- --listen "127.0.0.1:$((port + 10 * i))" --key-file "$dir/key" --transport "$tr" --shm "${SHM:-auto}" \
          --iters 1300 --target-acc 0 --eval-every 100
        if [ "$i" = 0 ]; then set -- "$@" --min-workers 4; else set -- "$@" --seed "127.0.0.1:$port"; fi
        fp=
        if [ "$i" = 2 ]; then fp=${PROBE_FAILPOINT:-probe@1000}; fi
        GYRE_FAILPOINT=$fp GOMAXPROCS=1 "$gyre" --log-format json --log-level warn train "$@" \
          >/dev/null 2>"$dir/w$i.err" &
        pids="$pids $!"
        if [ "$i" != 2 ]; then survivors="$survivors $!"; fi
      done
      while [ "$(cat "$dir"/w*.err | grep -c '"recovered' || true)" -lt 3 ]; do
        if ! kill -0 $survivors 2>/dev/null; then echo "a worker exited before 3 recovered:"; cat "$dir"/w*.err; exit 1; fi
        sleep 0.05
      done
      total=$(cat "$dir"/w*.err | grep '"recovered' | field total | sort -n | tail -1)
      detect=$(cat "$dir"/w*.err | grep '"recovered' | field detect | sort -n | tail -1)
      echo "$tr run $run: the last survivor recovered $total ms after the lost worker's last heartbeat (detect $detect ms)"
      echo "$total $detect" >>"$dir/$tr.runs"
      kill $pids 2>/dev/null || true
      wait 2>/dev/null || true
      sleep 1
    done
    echo "$tr median of $runs: recovery from a kill as the probes begin $(cut -d' ' -f1 "$dir/$tr.runs" | median) ms;" \
      "detect $(cut -d' ' -f2 "$dir/$tr.runs" | median) ms"
  done
  exit 0
fi
for tr in $transports; do
  : >"$dir/$tr.runs"
  for run in $(seq "$runs"); do
    rm -f "$dir/job.err" "$dir/job.out"
    "$gyre" --log-format json --log-level warn launch -n 4 --transport "$tr" --shm "${SHM:-auto}" -- \
      train --iters 1000000 --target-acc 0 --eval-every 100 >"$dir/job.out" 2>"$dir/job.err" &
    job=$!
    while ! grep -q '^\[0\] *100 ' "$dir/job.out" 2>/dev/null; do sleep 0.05; done
    victim=$(cat /proc/"$job"/task/*/children | tr ' ' '\n' | grep . | sort -n | sed -n 3p)
    t0=$(ms)
    kill -KILL "$victim"
    while [ "$(grep -c '"recovered' "$dir/job.err" || true)" -lt 3 ]; do sleep 0.005; done
    t1=$(ms)
    last=$(grep '"recovered' "$dir/job.err" | tail -1)
    detect=$(echo "$last" | field detect)
    agree=$(echo "$last" | field agree)
    transfer=$(echo "$last" | field transfer)
    echo "$tr run $run: $((t1 - t0)) ms from kill to the last Redo; its phases: detect $detect ms, agree $agree ms, transfer $transfer ms"
    echo "$((t1 - t0)) $detect $agree $transfer" >>"$dir/$tr.runs"
    kill -TERM "$job"
    wait "$job" 2>/dev/null || true
    sleep 1
  done
  echo "$tr median of $runs: kill to last Redo $(cut -d' ' -f1 "$dir/$tr.runs" | median) ms;" \
    "detect $(cut -d' ' -f2 "$dir/$tr.runs" | median) ms, agree $(cut -d' ' -f3 "$dir/$tr.runs" | median) ms," \
    "transfer $(cut -d' ' -f4 "$dir/$tr.runs" | median) ms"
done
