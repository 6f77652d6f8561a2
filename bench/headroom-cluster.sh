#!/bin/sh
# CPU headroom for the transport under overlap: `gyre bench overlap` on two
# hosts of the namespace cluster, each capped at one core and run with
# GOMAXPROCS=2, with the model's compute on every P (--compute-procs all)
# and with one P left free (--compute-procs auto), interleaved.
#   sh bench/headroom-cluster.sh "$CLUSTER_SH" [ROUNDS] [RATE] [gyre bench overlap flags...]
# e.g.
#   sh bench/headroom-cluster.sh "$CLUSTER_SH"
#   sh bench/headroom-cluster.sh "$CLUSTER_SH" 5 250mbit --batch 1024 --iters 10
# ROUNDS (default 5) pairs of runs; RATE (default 250mbit) caps both hosts'
# links. The default flags (--batch 1024 --iters 10 -w 2, the default
# model, QUIC) put comm/backward at 0.8-1.0 at 250mbit. CPU caps and
# GOMAXPROCS can be changed with CPU=P1,P2 and MAXPROCS=K, as
# bench/cluster-job.sh reads them; CLUSTER_ID=K picks the cluster.
#
# Per round it prints, from the two runs' tables:
#   bound      forward + max(backward, comm) of the run without headroom
#   over       the headroom run's overlapped iteration / that bound
#   own        the same over the headroom run's own bound
#   sps        samples/s with headroom / without (overlapped iterations)
#   speedup    no-overlap / overlap with headroom (and without)
#   ideal      (F+B+C)/(F+max(B,C)) from the headroom run's phases
# and the medians over rounds. Outputs go to bench/out/headroom-TIMESTAMP/.
set -eu
[ $# -ge 1 ] || { sed -n '2,24p' "$0" | cut -c3- >&2; exit 2; }
[ -f "${1:-}" ] || { echo "headroom-cluster: the first argument must be the namespace-cluster script, \$CLUSTER_SH (see README), not '${1:-}'" >&2; exit 2; }
cluster=$1; shift
rounds=5 rate=250mbit
case "${1:-}" in ''|-*) ;; *) rounds=$1; shift ;; esac
case "${1:-}" in ''|-*) ;; *) rate=$1; shift ;; esac
[ $# -gt 0 ] || set -- --batch 1024 --iters 10 -w 2
here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/bench/out/headroom-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
export CPU="${CPU:-100,100}" MAXPROCS="${MAXPROCS:-2}"
for r in $(seq 1 "$rounds"); do
  for procs in all auto; do
    OUT="$out/$r-$procs" sh "$here/bench/cluster-job.sh" "$cluster" 2 "$rate" bench overlap \
      --compute-procs "$procs" --json "$out/$r-$procs/overlap.json" "$@" > "$out/$r-$procs.txt" 2>&1 ||
      { echo "headroom-cluster: round $r, --compute-procs $procs failed; see $out/$r-$procs.txt" >&2; exit 1; }
  done
done
echo "# gyre bench overlap $*  over $rate, 2 hosts, CPU $CPU, GOMAXPROCS $MAXPROCS; compute procs all against auto, $rounds rounds"
# phases FILE: "mode:phase=ms ..." from a table's median rows.
phases() { awk '$1 ~ /^(overlap|no-overlap|compute|comm)$/ && NF == 5 && $3 ~ /^[0-9]+$/ { printf "%s:%s=%.3f ", $1, $2, $3 / 1000 }' "$1"; }
for r in $(seq 1 "$rounds"); do
  echo "$r $(phases "$out/$r-all.txt") | $(phases "$out/$r-auto.txt")"
done | awk '
function get(s, k,   i, n, kv) { n = split(s, kv, " "); for (i = 1; i <= n; i++) if (index(kv[i], k "=") == 1) return substr(kv[i], length(k) + 2) + 0; return 0 }
function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t } return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
BEGIN { printf "%5s %9s %6s %6s %6s %8s %8s %6s\n", "round", "bound_ms", "over", "own", "sps", "speedup", "(all)", "ideal" }
{
  split($0, half, "|"); all = half[1]; auto = half[2]
  F = get(auto, "compute:forward"); B = get(auto, "compute:backward"); C = get(auto, "comm:iteration")
  bound = get(all, "compute:forward") + (get(all, "compute:backward") > get(all, "comm:iteration") ? get(all, "compute:backward") : get(all, "comm:iteration"))
  ov = get(auto, "overlap:iteration")
  n++
  v1[n] = bound; v2[n] = ov / bound; v3[n] = ov / (F + (B > C ? B : C)); v4[n] = get(all, "overlap:iteration") / ov
  v5[n] = get(auto, "no-overlap:iteration") / ov; v6[n] = get(all, "no-overlap:iteration") / get(all, "overlap:iteration"); v7[n] = (F + B + C) / (F + (B > C ? B : C))
  printf "%5d %9.1f %6.3f %6.3f %6.3f %8.3f %8.3f %6.3f\n", $1, v1[n], v2[n], v3[n], v4[n], v5[n], v6[n], v7[n]
}
END { printf "%5s %9.1f %6.3f %6.3f %6.3f %8.3f %8.3f %6.3f\n", "med", med(v1, n), med(v2, n), med(v3, n), med(v4, n), med(v5, n), med(v6, n), med(v7, n) }'
echo "outputs in $out" >&2
