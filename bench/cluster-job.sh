#!/bin/sh
# One gyre job on N hosts of the namespace cluster: one worker per host,
# each bound to its host's own address, every host's link capped.
#   sh bench/cluster-job.sh "$CLUSTER_SH" N RATE GYRE_ARGS...
# e.g.
#   sh bench/cluster-job.sh "$CLUSTER_SH" 3 1gbit train --iters 300
#   sh bench/cluster-job.sh "$CLUSTER_SH" 2 1gbit bench allreduce --sizes 64M --compress bf16
# CLUSTER_SH is the namespace-cluster script (root; README). RATE caps
# each host's link both ways (tc tbf), or "off". GYRE_ARGS is the gyre
# subcommand every worker runs; workers get the static view, their rank and
# the cluster key through GYRE_* variables, as under `gyre launch`.
# CLUSTER_ID=K (0-9) picks the cluster, as the cluster script reads it;
# runs with the same id must not overlap. OUT=DIR keeps the outputs there
# (default bench/out/cluster-TIMESTAMP/).
# Options, as variables:
#   CPU=P1,P2,...   cap host i's processes to Pi% of one core ("-" or off:
#                   none); capped hosts run with GOMAXPROCS=MAXPROCS
#   MAXPROCS=K      GOMAXPROCS in capped hosts (default 1)
#   RACKS=R         hosts in R racks (host i in rack (i-1)%R+1)
#   TRUNK=RATE      cap every rack's uplink both ways (with RACKS > 1)
#   KILL=I:SECONDS  kill -9 host I's worker SECONDS after the start, and
#                   report how long rank 0 took to exit after it
#   RECAP=I:P:SECONDS  set host I's CPU cap to P% SECONDS after the start
#   LOGLEVEL=L      the workers' log level (default warn)
#   PROGRAM=PATH    run this trainer (one that embeds Gyre) instead of
#                   gyre: GYRE_ARGS are then its arguments
#   PER_HOST=K      K workers on each host (default 1): rank r on host
#                   r/K+1, gossip port 7946+10·(r mod K); they reach each
#                   other through shared memory, other hosts over the link
# In GYRE_ARGS, @RANK@ becomes the worker's rank (for --metrics-file).
#
# It builds gyre, brings up N hosts, writes a cluster key, starts ranks N-1
# to 1 in the background and rank 0 in the foreground, and prints rank 0's
# output with the load before and after. The cluster is torn down on exit,
# whatever happens.
set -eu
[ $# -ge 4 ] || { sed -n '2,33p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "cluster-job: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
n=$2 rate=$3
shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-"$here/bench/out/cluster-$(date -u +%Y%m%dT%H%M%SZ)"}
mkdir -p "$out"
gyre="$out/gyre"
(cd "$here" && go build -o "$gyre" ./cmd/gyre)

# `up` and `rate` need ip and tc (iproute2); install them if missing.
command -v ip >/dev/null && command -v tc >/dev/null || "$cluster" deps

trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM
"$cluster" up "$n" "${RACKS:-1}"
[ -z "${TRUNK:-}" ] || "$cluster" trunk "$TRUNK"
k=${PER_HOST:-1}
ranks=$((n * k))
peers=""
for i in $(seq 1 "$n"); do
  [ "$rate" = off ] || "$cluster" rate "$i" "$rate"
  for j in $(seq 0 $((k - 1))); do
    peers="$peers${peers:+,}$("$cluster" addr "$i"):$((7947 + 10 * j))"
  done
done
# cap I: host I's CPU cap from CPU, or empty.
cap() { echo "${CPU:-}" | tr ',' '\n' | sed -n "${1}p" | grep -Ev '^(-|off|)$' || true; }
for i in $(seq 1 "$n"); do
  [ -z "$(cap "$i")" ] || "$cluster" cpu "$i" "$(cap "$i")"
done
"$gyre" keygen --out "$out/cluster.key" 2>/dev/null

# The hosts share this machine's cores with anything else running: keep the
# load and the busiest processes beside the results.
load() { echo "load $1: $(uptime | sed 's/^ *//')"; ps -eo pcpu=,comm= --sort=-pcpu | grep -v ' ps$' | head -n 4 | sed 's/^/  busiest: /'; }
{ echo "hosts $n  rate $rate  cpu ${CPU:-none}  racks ${RACKS:-1}  trunk ${TRUNK:-none}  command: ${PROGRAM:-gyre} $*"; load before; } > "$out/load.txt"
# worker RANK: rank RANK in host RANK/K+1, bound to that host's own address.
worker() {
  rank=$1; shift
  host=$((rank / k + 1))
  addr=$("$cluster" addr "$host")
  procs=""
  [ -z "$(cap "$host")" ] || procs="GOMAXPROCS=${MAXPROCS:-1}"
  # @RANK@ in an argument becomes the rank (arguments have no spaces).
  args=""
  for a in "$@"; do args="$args $(printf '%s' "$a" | sed "s/@RANK@/$rank/g")"; done
  if [ -n "${PROGRAM:-}" ]; then
    set -- "$PROGRAM"
  else
    set -- "$gyre" --log-level "${LOGLEVEL:-warn}" --log-format json
  fi
  # shellcheck disable=SC2086
  "$cluster" run "$host" env $procs GYRE_PEERS="$peers" GYRE_RANK="$rank" GYRE_WORLD_SIZE="$ranks" \
    GYRE_KEY_FILE="$out/cluster.key" GYRE_LISTEN="$addr:$((7946 + 10 * (rank % k)))" \
    "$@" $args
}
pids=""
for r in $(seq $((ranks - 1)) -1 1); do
  worker "$r" "$@" > "$out/rank$r.txt" 2> "$out/rank$r.log" &
  pids="$pids $!"
done
if [ -n "${KILL:-}" ]; then
  victim=${KILL%%:*} after=${KILL#*:}
  (
    sleep "$after"
    date +%s%N > "$out/kill.txt"
    for p in $(ip netns pids "gy${CLUSTER_ID:-0}h$victim"); do kill -9 "$p"; done
  ) &
fi
if [ -n "${RECAP:-}" ]; then
  host=${RECAP%%:*} rest=${RECAP#*:}
  (sleep "${rest#*:}" && "$cluster" cpu "$host" "${rest%%:*}" && date +%s%N > "$out/recap.txt") &
fi
status=0
worker 0 "$@" > "$out/rank0.txt" 2> "$out/rank0.log" || status=$?
ended=$(date +%s%N)
if [ -s "$out/kill.txt" ]; then
  echo "# kill -9 of host $victim's worker: rank 0 exited $(( (ended - $(cat "$out/kill.txt")) / 1000000 )) ms later (status $status): $(grep -o 'lost rank [0-9]*[^:]*' "$out/rank0.log" | head -1)" >> "$out/load.txt"
fi
# A failed rank 0 leaves the others waiting for it: stop the hosts' processes.
[ "$status" -eq 0 ] || "$cluster" down >/dev/null 2>&1 || true
for p in $pids; do
  s=0
  wait "$p" || s=$?
  [ "$status" -ne 0 ] || status=$s
done
load after >> "$out/load.txt"

cat "$out/rank0.txt"
echo "# cluster: $n hosts, $k workers each ($peers), each link capped at $rate both ways"
sed 's/^/# /' "$out/load.txt"
if [ "$status" -ne 0 ]; then
  echo "cluster-job: a worker failed (status $status); logs:" >&2
  for r in $(seq 0 $((ranks - 1))); do tail -n 20 "$out/rank$r.log" >&2; done
fi
echo "outputs in $out" >&2
exit "$status"
