#!/bin/sh
# Locality-aware ring order against address order, on two racks behind a
# slow trunk: the issue's scenario.
#   sh bench/locality-cluster.sh "$CLUSTER_SH" [TRANSPORT]
# e.g.
#   sh bench/locality-cluster.sh "$CLUSTER_SH" tcp
# It brings up 4 hosts of the cluster script (root; README) in 2 racks
# (hosts 1 and 3 in one, 2 and 4 in the other) with every rack uplink
# capped at TRUNK (default 200mbit), so that address order 1-2-3-4
# crosses the trunk at every link, and runs `gyre bench allreduce` of
# SIZE (default 64M) with --ring-order fixed and then auto, ROUNDS times
# (default 3) alternately. It prints each run's ring and median time, per
# order the median over the runs, and the busbw ratio auto/fixed (fixed's
# time over auto's; each run's table gives its busbw).
# TRANSPORT is tcp (TLS; default) or quic. OUT=DIR keeps the outputs.
# HOSTS=N runs N hosts instead of 4 (odd hosts in one rack, even in the
# other, so address order still crosses the trunk at every link).
set -eu
[ $# -ge 1 ] || { sed -n '2,17p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "locality-cluster: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$1
transport=${2:-tcp}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-"$here/bench/out/locality-$(date -u +%Y%m%dT%H%M%SZ)-$transport"}
mkdir -p "$out"
size=${SIZE:-64M}
for i in $(seq 1 "${ROUNDS:-3}"); do
  for order in fixed auto; do
    run="$order-$i"
    env OUT="$out/$run" RACKS=2 TRUNK="${TRUNK:-200mbit}" GYRE_TRANSPORT="$transport" LOGLEVEL=info \
      sh "$here/bench/cluster-job.sh" "$cluster" "${HOSTS:-4}" off \
      bench allreduce --sizes "$size" --iters "${ITERS:-5}" -w 1 --ring-order "$order" > "$out/$run.txt" 2>&1 || {
      echo "locality-cluster: the $run run failed; see $out/$run.txt and $out/$run/" >&2
      exit 1
    }
    # The table's header names the ring; its one row holds the median time.
    ring=$(sed -n 's/.*  ring \([0-9-]*\)  .*/\1/p' "$out/$run.txt" | head -n 1)
    us=$(awk '$1 ~ /^[0-9]+$/ && NF == 8 { print $3 }' "$out/$run.txt" | head -n 1)
    echo "$order $ring $us" >> "$out/runs.txt"
    echo "run $run: ring $ring  median ${us} us"
  done
done
awk '
  { t[$1] = t[$1] " " $3 }
  function median(s,   a, k, i, j, x) {
    k = split(s, a, " ")
    for (i = 2; i <= k; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
    return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
  }
  END {
    for (o in t) m[o] = median(t[o])
    printf "transport '"$transport"'  hosts '"${HOSTS:-4}"'  size '"$size"'  trunk '"${TRUNK:-200mbit}"'\n"
    for (o in m) printf "%-5s median %.0f us over the runs\n", o, m[o]
    if (m["fixed"] > 0 && m["auto"] > 0) printf "auto/fixed busbw %.2f\n", m["fixed"] / m["auto"]
  }' "$out/runs.txt" | tee "$out/summary.txt"
echo "outputs in $out"
