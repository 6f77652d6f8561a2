#!/bin/sh
# Interleaved comparison of Gyre's N=2 allreduce over quic with bare
# quic-go sending the same bytes both ways at once (a two-rank ring's traffic,
# each direction on its own connection, as in Gyre).
#   sh bench/compare-quic.sh RUNS SIZES STRIPES [gyre flags...]
# e.g.
#   sh bench/compare-quic.sh 3 67108864,268435456 1,2,4
# Each round runs, one after the other, gyre bench allreduce -n 2 --transport
# quic --stripes S for each S in STRIPES (a comma list), then one gyre bench
# transport --bidir --transport quic --stripes 1 (gyre's quic transport and
# bare quic-go, TRANSPORT_RUNS interleaved runs, default 1: the rounds are the
# repetitions). The extra flags go to both commands (e.g. --iters 5 -w 1).
# The tables go to bench/out/; the summary gives, per size and stripe count,
# the median allreduce busbw, the median bidir GB/s of gyre's transport and of
# bare quic-go (both at 1 stripe), and the median over rounds of the per-round
# ratio busbw/bare (above 1 is faster).
#
# Units: for N=2, busbw = algbw * 2(N-1)/N = size/time, and in that time each
# rank sends size bytes (half in reduce-scatter, half in allgather) while it
# receives as many: busbw is bytes per second per direction. The bidir table's
# GB/s is the bytes one side sent / time, also per direction, and both use
# GB/s = 1e9 bytes/s, so the ratio compares like with like.
set -eu
runs=$1; sizes=$2; stripes=$3; shift 3
here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/bench/out/compare-quic-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
gyre="$out/gyre"
(cd "$here" && go build -o "$gyre" ./cmd/gyre)
echo "# compare-quic runs=$runs sizes=$sizes stripes=$stripes gyre flags: $*" | tee "$out/summary.txt"
for r in $(seq 1 "$runs"); do
  for s in $(echo "$stripes" | tr ',' ' '); do
    "$gyre" --log-level error bench allreduce -n 2 --transport quic --stripes "$s" --sizes "$sizes" "$@" > "$out/ar.s$s.$r" 2>/dev/null
  done
  "$gyre" --log-level error bench transport --bidir --transport quic --stripes 1 --sizes "$sizes" \
    --runs "${TRANSPORT_RUNS:-1}" "$@" > "$out/bidir.$r" 2>/dev/null
  echo "round $r done" >&2
done
# allreduce rows: size_bytes count med min algbw busbw iters chk.
# bidir rows: variant stripes size_bytes iters time_us GB/s bare_GB/s ratio.
awk -v runs="$runs" -v stripes="$stripes" '
  function median(a, k,   i, j, t, m) {
    for (i = 1; i <= k; i++) for (j = i + 1; j <= k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
    m = int((k + 1) / 2); return (k % 2) ? a[m] : (a[m] + a[m + 1]) / 2
  }
  FNR == 1 { n = split(FILENAME, p, "/"); nf = split(p[n], q, "."); kind = q[1]; run = q[nf]; s = (nf == 3) ? substr(q[2], 2) : "" }
  kind == "ar" && $1 ~ /^[0-9]+$/ && NF >= 8 { bw[s, run, $1] = $6; sizes[$1] = 1; if ($8 != "OK") bad = 1 }
  kind == "bidir" && $1 == "quic" && NF == 8 { gyre[run, $3] = $6; bare[run, $3] = $7 }
  END {
    printf "%12s %7s %11s %15s %15s %16s\n", "size_bytes", "stripes", "busbw(med)", "gyre bidir(med)", "bare bidir(med)", "busbw/bare(med)"
    for (x in sizes) order[++ns] = x + 0
    for (i = 1; i <= ns; i++) for (j = i + 1; j <= ns; j++) if (order[j] < order[i]) { t = order[i]; order[i] = order[j]; order[j] = t }
    nst = split(stripes, st, ",")
    for (i = 1; i <= ns; i++) {
      z = order[i]; cg = 0; cb = 0; delete g; delete b
      for (r = 1; r <= runs; r++) {
        if ((r, z) in gyre) g[++cg] = gyre[r, z]
        if ((r, z) in bare) b[++cb] = bare[r, z]
      }
      for (k = 1; k <= nst; k++) {
        s = st[k]; c = 0; cr = 0; delete a; delete rt
        for (r = 1; r <= runs; r++) {
          if (!((s, r, z) in bw)) continue
          a[++c] = bw[s, r, z]
          if ((r, z) in bare && bare[r, z] > 0) rt[++cr] = bw[s, r, z] / bare[r, z]
        }
        if (c == 0) continue
        printf "%12d %7d %11.3f %15.3f %15.3f %16s\n", z, s, median(a, c), cg ? median(g, cg) : 0, cb ? median(b, cb) : 0, cr ? sprintf("%.3f", median(rt, cr)) : "-"
      }
    }
    print "# GB/s = 1e9 bytes/s, per direction; busbw/bare is the median over rounds of the per-round ratio"
    if (bad) print "WARNING: an allreduce reported a failed check"
  }' "$out"/ar.* "$out"/bidir.* | tee -a "$out/summary.txt"
echo "tables in $out" >&2
