#!/bin/sh
# Time from a joiner's start to its first iteration in a running job.
#   sh bench/join-time.sh [RUNS]
# Each run starts a 4-worker `gyre launch ... train` on loopback, waits until
# it trains, starts a 5th `gyre train --seed`, and prints the time from
# starting the joiner's process to its "admitted" log line (after which it
# runs its first iteration), the joiner's own Join-to-admitted time and the
# iteration it entered at. Then the joiner gets SIGTERM (it leaves) and the
# job is stopped. RUNS defaults to 5.
set -eu
cd "$(dirname "$0")/.."
runs=${1:-5}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$dir"' EXIT
go build -o "$dir/gyre" ./cmd/gyre
gyre="$dir/gyre"
"$gyre" keygen --out "$dir/cluster.key" 2>/dev/null
model="--iters 1000000 --target-acc 0 --hidden 16 --batch 48"
ms() { echo $(( $(date +%s%N) / 1000000 )); }
for run in $(seq "$runs"); do
  # The last run's logs go first: a background job's redirection may
  # truncate its file after the loops below have looked at the old one.
  rm -f "$dir/job.err" "$dir/joiner.err"
  # shellcheck disable=SC2086
  "$gyre" --log-format json launch -n 4 --key-file "$dir/cluster.key" -- train $model >"$dir/job.out" 2>"$dir/job.err" &
  job=$!
  while ! grep -q '"joined"' "$dir/job.err" 2>/dev/null; do sleep 0.1; done
  sleep 1
  seed=$(sed -n 's/.*seed \([0-9.:]*\),.*/\1/p' "$dir/job.err" | head -1)
  t0=$(ms)
  # shellcheck disable=SC2086
  "$gyre" --log-format json train --seed "$seed" --listen 127.0.0.1:0 --data-addr 127.0.0.1:0 \
    --key-file "$dir/cluster.key" --gossip-timing local $model >"$dir/joiner.out" 2>"$dir/joiner.err" &
  joiner=$!
  while ! grep -q '"admitted"' "$dir/joiner.err" 2>/dev/null; do sleep 0.005; done
  t1=$(ms)
  line=$(grep '"admitted"' "$dir/joiner.err")
  iter=$(echo "$line" | sed 's/.*"iter":\([0-9]*\).*/\1/')
  since=$(echo "$line" | sed 's/.*"since_join":\([0-9.]*\).*/\1/')
  echo "run $run: $((t1 - t0)) ms from process start to admitted; Join to admitted $since ms; entered at iteration $iter"
  kill -TERM "$joiner"
  wait "$joiner" || true
  kill -TERM "$job"
  wait "$job" 2>/dev/null || true
  sleep 1
done
