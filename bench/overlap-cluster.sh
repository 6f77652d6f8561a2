#!/bin/sh
# The overlap scenario on two hosts of the namespace cluster: one worker of
# `gyre bench overlap` per host, each host's link capped so that transfers
# are link-bound, not CPU-bound.
#   sh bench/overlap-cluster.sh CLUSTER_SH [RATE] [gyre bench overlap flags...]
# e.g.
#   sh bench/overlap-cluster.sh ../shared/cluster/cluster.sh
#   sh bench/overlap-cluster.sh ../shared/cluster/cluster.sh 100mbit --batch 3072 --iters 20
# CLUSTER_SH is the path of the cluster script (it needs root). RATE caps
# both hosts' links both ways (tc tbf; default 50mbit; may be left out
# before flags), which with the
# default model puts communication at 0.5-1.0x the backward pass. The flags
# go to both workers (--hidden, --batch, --bucket-bytes, --iters, -w,
# --transport, ...). CLUSTER_ID=K (0-9) picks the cluster, as the cluster
# script reads it; runs with the same id must not overlap.
#
# It builds gyre, brings up 2 hosts, writes a cluster key, starts rank 1 on
# host 2 and rank 0 on host 1, each bound to its host's own address, and
# prints rank 0's table. Outputs (tables, logs, the --json report, the load)
# go to bench/out/overlap-cluster-TIMESTAMP/. The cluster is torn down on
# exit, whatever happens.
set -eu
[ $# -ge 1 ] || { sed -n '2,20p' "$0" | cut -c3- >&2; exit 2; }
cluster=$(cd "$(dirname "$1")" && pwd)/$(basename "$1"); shift
# RATE may be left out: a first argument starting with '-' is a flag.
rate=50mbit
case "${1:-}" in ''|-*) ;; *) rate=$1; shift ;; esac
here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/bench/out/overlap-cluster-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
gyre="$out/gyre"
(cd "$here" && go build -o "$gyre" ./cmd/gyre)

# `up` and `rate` need ip and tc (iproute2); install them if missing.
command -v ip >/dev/null && command -v tc >/dev/null || "$cluster" deps

trap '"$cluster" down >/dev/null 2>&1 || true' EXIT
trap 'exit 130' INT TERM
"$cluster" up 2
a1=$("$cluster" addr 1)
a2=$("$cluster" addr 2)
"$cluster" rate 1 "$rate"
"$cluster" rate 2 "$rate"
"$gyre" keygen --out "$out/cluster.key" 2>/dev/null
peers="$a1:7947,$a2:7947"

# The two hosts share this machine's cores with anything else running:
# keep the load and the busiest processes beside the results.
load() { echo "load $1: $(uptime | sed 's/^ *//')"; ps -eo pcpu=,comm= --sort=-pcpu | grep -v ' ps$' | head -n 4 | sed 's/^/  busiest: /'; }
{ echo "rate $rate  flags: $*"; load before; } > "$out/load.txt"
# worker I ADDR RANK [FLAGS...]: one worker in host I, bound to its own address.
worker() {
  i=$1 addr=$2 rank=$3; shift 3
  "$cluster" run "$i" env GYRE_PEERS="$peers" GYRE_RANK="$rank" GYRE_WORLD_SIZE=2 \
    GYRE_KEY_FILE="$out/cluster.key" GYRE_LISTEN="$addr:7946" \
    "$gyre" --log-level warn bench overlap --json "$out/overlap.json" "$@"
}
worker 2 "$a2" 1 "$@" > "$out/rank1.txt" 2> "$out/rank1.log" &
pid1=$!
status=0
worker 1 "$a1" 0 "$@" > "$out/rank0.txt" 2> "$out/rank0.log" || status=$?
# A failed rank 0 leaves rank 1 waiting for it: stop the hosts' processes.
[ "$status" -eq 0 ] || "$cluster" down >/dev/null 2>&1 || true
s1=0
wait "$pid1" || s1=$?
[ "$status" -ne 0 ] || status=$s1
load after >> "$out/load.txt"

cat "$out/rank0.txt"
echo "# cluster: 2 hosts ($a1, $a2), each link capped at $rate both ways"
sed 's/^/# /' "$out/load.txt"
if [ "$status" -ne 0 ]; then
  echo "overlap-cluster: a worker failed (status $status); logs:" >&2
  tail -n 20 "$out/rank0.log" "$out/rank1.log" >&2
fi
echo "outputs in $out" >&2
exit "$status"
