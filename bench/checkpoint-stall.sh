#!/bin/sh
# What checkpoints cost a training job, per iteration.
#   sh bench/checkpoint-stall.sh HIDDEN [RUNS] [ITERS] [EVERY]
# e.g. (a state of about 100 MB, then about 1 GB)
#   sh bench/checkpoint-stall.sh 145000 5 60 10
#   sh bench/checkpoint-stall.sh 1450000 5 24 6
# Runs RUNS pairs of 2-worker gyre train jobs on loopback (tcp), by hand
# as README's recipe does, with --hidden HIDDEN (a state of 16·43·HIDDEN
# bytes: parameters and momentum, float64) and --batch 16, alternating a
# job with --checkpoint-every EVERY into one shared directory (so one
# worker writes, on the local disk) and one with no checkpoints. From
# rank 0's --metrics-file (each iteration's wall time, Batch to the end of
# its Commit) it prints, per pair, the median time of the iterations
# whose Commit took a checkpoint, of the other iterations of that job,
# and of the job without checkpoints; then the medians over pairs. The
# first EVERY iterations of each job are left out (warm-up), and each job
# is stopped after its last iteration, before its final evaluation.
set -eu
hidden=$1; runs=${2:-5}; iters=${3:-60}; every=${4:-10}
cd "$(dirname "$0")/.."
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
go build -o "$dir/gyre" ./cmd/gyre
gyre="$dir/gyre"
"$gyre" keygen --out "$dir/key" >/dev/null 2>&1
job() { # mode run
  mode=$1; run=$2
  ck0=""; ck1=""
  if [ "$mode" = ckpt ]; then
    rm -rf "$dir/ckpt"
    ck0="--checkpoint-dir $dir/ckpt --checkpoint-every $every"; ck1=$ck0
  fi
  common="--transport tcp --key-file $dir/key --hidden $hidden --batch 16 --iters $iters --target-acc 0 --eval-every 100000 --timeout 30m"
  m="$dir/m.$mode.$run"
  : >"$m"
  # shellcheck disable=SC2086
  "$gyre" --log-level error train --listen 127.0.0.1:27946 --min-workers 2 $common $ck0 --metrics-file "$m" >/dev/null &
  p0=$!
  # shellcheck disable=SC2086
  "$gyre" --log-level error train --listen 127.0.0.1:27956 --seed 127.0.0.1:27946 $common $ck1 >/dev/null &
  p1=$!
  # The last iteration's line is all this needs: the final evaluation of
  # a very wide model takes minutes, so the job is stopped there.
  while [ "$(wc -l <"$m")" -lt "$iters" ] && kill -0 "$p0" 2>/dev/null; do sleep 1; done
  kill -9 "$p0" "$p1" 2>/dev/null || true
  wait "$p0" "$p1" 2>/dev/null || true
}
median() { sort -g | awk '{v[NR]=$1} END {if (NR==0) print "nan"; else if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
# seconds of the rows of a metrics file whose iteration satisfies cond
# (i is the iteration the row ended; i+1 is the one its Commit committed).
rows() { awk -v every="$every" "{ match(\$0, /\"iter\":[0-9]+/); i = substr(\$0, RSTART+7, RLENGTH-7) + 0;
  match(\$0, /\"seconds\":[0-9.e+-]+/); s = substr(\$0, RSTART+10, RLENGTH-10);
  if (i + 1 > every && ($1)) print s }" "$2"; }
echo "# checkpoint stall: hidden=$hidden (state about $((16 * 43 * hidden / 1000000)) MB) runs=$runs iters=$iters every=$every, $(nproc) cpus"
: >"$dir/pairs"
for run in $(seq "$runs"); do
  if [ $((run % 2)) -eq 1 ]; then job ckpt "$run"; job none "$run"; else job none "$run"; job ckpt "$run"; fi
  taken=$(rows "(i + 1) % every == 0" "$dir/m.ckpt.$run" | median)
  other=$(rows "(i + 1) % every != 0" "$dir/m.ckpt.$run" | median)
  none=$(rows "1" "$dir/m.none.$run" | median)
  echo "run $run: iterations taking a checkpoint ${taken}s, the others ${other}s, with no checkpoints ${none}s"
  echo "$taken $other $none" >>"$dir/pairs"
done
taken=$(awk '{print $1}' "$dir/pairs" | median)
other=$(awk '{print $2}' "$dir/pairs" | median)
none=$(awk '{print $3}' "$dir/pairs" | median)
echo "median over $runs runs: taking a checkpoint ${taken}s, others ${other}s, none ${none}s;" \
  "stall $(awk -v a="$taken" -v b="$other" 'BEGIN {printf "%.4f", a-b}')s, others/none $(awk -v a="$other" -v b="$none" 'BEGIN {printf "%.3f", a/b}')"
