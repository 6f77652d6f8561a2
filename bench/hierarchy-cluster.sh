#!/bin/sh
# The hierarchical allreduce against the flat ring on two machines of two
# workers each.
#   sh bench/hierarchy-cluster.sh "$CLUSTER_SH" [TRANSPORT]
# e.g.
#   sh bench/hierarchy-cluster.sh "$CLUSTER_SH" tcp
# It brings up 2 hosts of the cluster script (root; README), each link
# capped at RATE (default 1gbit) both ways, with 2 workers on each
# (cluster-job.sh's PER_HOST=2: the pair on a host reaches each other
# through shared memory), and runs `gyre bench allreduce` of SIZES
# (default 16M,64M) with --algo ring, hierarchical and auto in turn,
# ROUNDS times (default 5), the order rotating between rounds. It prints
# each run's medians and the cost model's predictions (from --json),
# then per algorithm and size the median over the runs, the ratio
# ring/hierarchical of the medians' times, and which algorithm auto ran.
# TRANSPORT is quic (default) or tcp. OUT=DIR keeps the outputs.
set -eu
[ $# -ge 1 ] || { sed -n '2,17p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "hierarchy-cluster: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$1
transport=${2:-quic}
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-"$here/bench/out/hierarchy-$(date -u +%Y%m%dT%H%M%SZ)-$transport"}
mkdir -p "$out"
sizes=${SIZES:-16M,64M}
for i in $(seq 1 "${ROUNDS:-5}"); do
  case $((i % 3)) in
    1) algos="ring hierarchical auto" ;;
    2) algos="hierarchical auto ring" ;;
    0) algos="auto ring hierarchical" ;;
  esac
  for algo in $algos; do
    run="$algo-$i"
    env OUT="$out/$run" PER_HOST=2 GYRE_TRANSPORT="$transport" LOGLEVEL=info \
      sh "$here/bench/cluster-job.sh" "$cluster" 2 "${RATE:-1gbit}" \
      bench allreduce --sizes "$sizes" --iters "${ITERS:-5}" -w 1 --algo "$algo" --json "$out/$run.json" > "$out/$run.txt" 2>&1 || {
      echo "hierarchy-cluster: the $run run failed; see $out/$run.txt and $out/$run/" >&2
      exit 1
    }
    python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    print(sys.argv[2], sys.argv[3], r["size_bytes"], r["algo"], r["time_us_median"], r["predicted_us"])
' "$out/$run.json" "$algo" "$i" | tee -a "$out/runs.txt"
  done
done
python3 - "$out/runs.txt" "$transport" "${RATE:-1gbit}" <<'PY' | tee "$out/summary.txt"
import collections, statistics, sys
runs = collections.defaultdict(list)
ran = collections.defaultdict(set)
for line in open(sys.argv[1]):
    algo, _, size, ran_algo, med, pred = line.split()
    runs[(algo, int(size))].append((float(med), float(pred)))
    ran[(algo, int(size))].add(ran_algo)
print(f"transport {sys.argv[2]}  rate {sys.argv[3]}  2 hosts x 2 workers")
for size in sorted({s for _, s in runs}):
    m = {}
    for algo in ("ring", "hierarchical", "auto"):
        xs = runs.get((algo, size))
        if not xs:
            continue
        med = statistics.median(x[0] for x in xs)
        pred = statistics.median(x[1] for x in xs)
        m[algo] = med
        print(f"{size:>10} {algo:<12} ran {'/'.join(sorted(ran[(algo, size)])):<20} median {med/1000:9.1f} ms  predicted {pred/1000:9.1f} ms  ({pred/med:.2f} of it)")
    if "ring" in m and "hierarchical" in m:
        print(f"{size:>10} ring/hierarchical time {m['ring']/m['hierarchical']:.2f}")
PY
echo "outputs in $out"
