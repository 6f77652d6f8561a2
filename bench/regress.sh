#!/bin/sh
# No-regression check of a change against a base commit, interleaved.
#   sh bench/regress.sh BASE [ROUNDS]
# e.g.
#   sh bench/regress.sh 6a0a060 5
# Builds gyre at BASE (a git worktree) and at the working tree, then runs
# ROUNDS rounds (default 5). Each round runs, for both binaries, in an
# order that alternates between rounds: gyre bench allreduce -n 2 at 4K,
# 1M and 64M (20 iterations) over quic and over tcp --insecure, and one
# gyre launch -n 4 -- train (its default job, to 95% accuracy). The raw
# outputs go to bench/out/regress-*/; the summary gives, per transport
# and size, the median over rounds of the per-round ratio of the median
# times base/new, and for train the median ratio of samples/s new/base.
# Above 1 the change is faster.
set -eu
base=$1; rounds=${2:-5}
here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/bench/out/regress-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$out"
wt="$out/base-src"
git -C "$here" worktree add -q --detach "$wt" "$base"
trap 'git -C "$here" worktree remove --force "$wt"' EXIT
(cd "$wt" && go build -o "$out/gyre-base" ./cmd/gyre)
(cd "$here" && go build -o "$out/gyre-new" ./cmd/gyre)
echo "# regress base=$base ($(git -C "$here" rev-parse --short "$base")) new=$(git -C "$here" rev-parse --short HEAD) rounds=$rounds" | tee "$out/summary.txt"
run() { # bin round
  b=$1; r=$2
  "$out/gyre-$b" --log-level error bench allreduce -n 2 --sizes 4K,1M,64M --iters 20 > "$out/ar-quic.$b.$r" 2>/dev/null
  "$out/gyre-$b" --log-level error bench allreduce -n 2 --transport tcp --insecure --sizes 4K,1M,64M --iters 20 > "$out/ar-tcp.$b.$r" 2>/dev/null
  "$out/gyre-$b" --log-level error launch -n 4 -- train > "$out/train.$b.$r" 2>/dev/null
}
for r in $(seq 1 "$rounds"); do
  if [ $((r % 2)) -eq 1 ]; then run base "$r"; run new "$r"; else run new "$r"; run base "$r"; fi
  echo "round $r done" >&2
done
# allreduce rows: size_bytes count med min algbw busbw iters chk.
med() { sort -g | awk '{v[NR]=$1} END {if (NR%2) print v[(NR+1)/2]; else print (v[NR/2]+v[NR/2+1])/2}'; }
for tr in quic tcp; do
  for size in 4096 1048576 67108864; do
    ratios=""
    for r in $(seq 1 "$rounds"); do
      tb=$(awk -v s="$size" '$1==s {print $3}' "$out/ar-$tr.base.$r")
      tn=$(awk -v s="$size" '$1==s {print $3}' "$out/ar-$tr.new.$r")
      ratios="$ratios $(awk -v b="$tb" -v n="$tn" 'BEGIN {printf "%.3f", b/n}')"
    done
    echo "allreduce $tr $size: base/new time ratios$ratios; median $(echo "$ratios" | tr ' ' '\n' | grep . | med)" | tee -a "$out/summary.txt"
  done
done
ratios=""
for r in $(seq 1 "$rounds"); do
  sb=$(grep -o '([0-9]* samples/s)' "$out/train.base.$r" | tr -d '(' | awk '{print $1}')
  sn=$(grep -o '([0-9]* samples/s)' "$out/train.new.$r" | tr -d '(' | awk '{print $1}')
  ratios="$ratios $(awk -v b="$sb" -v n="$sn" 'BEGIN {printf "%.3f", n/b}')"
done
echo "train samples/s new/base ratios$ratios; median $(echo "$ratios" | tr ' ' '\n' | grep . | med)" | tee -a "$out/summary.txt"
