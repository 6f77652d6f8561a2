#!/bin/sh
# Interleaved allreduce comparison of Gyre with the reference peers.
#   sh bench/compare-allreduce.sh "$PEERS" N RUNS SIZES [gyre flags...]
# e.g.
#   sh bench/compare-allreduce.sh "$PEERS" 2 5 4096,67108864,268435456 --transport tcp --insecure
# PEERS is the reference peers' directory (README): its run.sh runs them
# (install them once with `sh "$PEERS/run.sh" install`).
# Open MPI's driver ignores SIZES and runs its full sweep; only the sizes
# Gyre ran are summarised.
# Each round runs gyre bench allreduce, Gloo and Open MPI over TCP one after
# the other, RUNS times (MPI=mpi-shm runs Open MPI over shared memory
# instead, and GLOO=0 leaves Gloo out); the tables go to bench/out/, and
# the summary gives,
# per size, each tool's median busbw and time, and the median over rounds of
# the per-round ratios gyre/peer (busbw: above 1 is faster; time: below 1 is faster).
set -eu
[ $# -ge 4 ] || { sed -n '2,15p' "$0" | cut -c3- >&2; exit 2; }
[ -f "$1/run.sh" ] || { echo "compare-allreduce: the first argument must be the reference peers' directory, \$PEERS (see README), with run.sh in it; got '$1'" >&2; exit 2; }
peers=$(cd "$1" && pwd); n=$2; runs=$3; sizes=$4; shift 4
here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/bench/out/compare-n$n-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
gyre="$out/gyre"
mpi=${MPI:-mpi-tcp}
(cd "$here" && go build -o "$gyre" ./cmd/gyre)
gsizes=$(echo "$sizes" | tr ',' '\n' | awk '{printf "%s%s", sep, $1; sep=","}')
echo "# compare-allreduce n=$n runs=$runs sizes=$sizes open mpi: $mpi gyre flags: $*" | tee "$out/summary.txt"
for r in $(seq 1 "$runs"); do
  "$gyre" --log-level error bench allreduce -n "$n" --sizes "$gsizes" "$@" > "$out/gyre.$r" 2>/dev/null
  if [ "${GLOO:-1}" = 1 ]; then SIZES="$sizes" sh "$peers/run.sh" gloo "$n" > "$out/gloo.$r" 2>/dev/null; fi
  SIZES="$sizes" sh "$peers/run.sh" "$mpi" "$n" > "$out/mpi.$r" 2>/dev/null || true
  echo "round $r done" >&2
done
# Rows are: size_bytes count med min algbw busbw iters chk.
awk -v runs="$runs" '
  function median(a, k,   i, j, t, m) {
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    m = int((k + 1) / 2); return (k % 2) ? a[m] : (a[m] + a[m + 1]) / 2
  }
  FNR == 1 { split(FILENAME, p, "/"); f = p[length(p)]; split(f, q, "."); tool = q[1]; run = q[2] }
  $1 ~ /^[0-9]+$/ && NF >= 8 { bw[tool, run, $1] = $6; t[tool, run, $1] = $3; sizes[$1] = 1; if ($8 != "OK") bad[tool] = 1 }
  END {
    printf "%12s %-6s %12s %10s %14s %14s\n", "size_bytes", "tool", "time_us(med)", "busbw(med)", "busbw ratio", "time ratio"
    for (s in sizes) order[++ns] = s + 0
    for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (order[j] < order[i]) { x = order[i]; order[i] = order[j]; order[j] = x }
    for (i = 1; i <= ns; i++) {
      s = order[i]
      split("gyre gloo mpi", tools, " ")
      for (k = 1; k <= 3; k++) {
        tl = tools[k]; c = 0; ct = 0; cr = 0; crt = 0
        delete b; delete tt; delete rb; delete rt
        for (r = 1; r <= runs; r++) {
          if ((tl, r, s) in bw) { b[++c] = bw[tl, r, s]; tt[++ct] = t[tl, r, s] }
          if (tl != "gyre" && (tl, r, s) in bw && ("gyre", r, s) in bw && bw[tl, r, s] > 0) {
            rb[++cr] = bw["gyre", r, s] / bw[tl, r, s]; rt[++crt] = t["gyre", r, s] / t[tl, r, s]
          }
        }
        if (c == 0 || !(("gyre", 1, s) in bw)) continue
        if (tl == "gyre") printf "%12d %-6s %12.1f %10.3f %14s %14s\n", s, tl, median(tt, ct), median(b, c), "-", "-"
        else printf "%12d %-6s %12.1f %10.3f %14.3f %14.3f\n", s, tl, median(tt, ct), median(b, c), median(rb, cr), median(rt, crt)
      }
    }
    for (tl in bad) printf "WARNING: %s reported a failed check\n", tl
  }' "$out"/gyre.* $(ls "$out"/gloo.* 2>/dev/null) "$out"/mpi.* | tee -a "$out/summary.txt"
echo "tables in $out" >&2
