#!/usr/bin/env bash
# The CPU-bound steps that start no process and open no socket: a build
# without cgo, the collectives' long matrix, the task's accuracy check,
# the recovery simulator and the fuzzers. .ci/run starts this at the
# lowest priority (nice 19) beside its race and real-process steps, which
# leave part of the 2 cores idle while tests and workers wait on
# timeouts; at nice 19 it takes mostly that idle time. Those steps still
# run 10 to 35% slower beside it, but CI as a whole is shorter
# (bench/RESULTS.md). Run alone, it is an ordinary script:
# bash .ci/pure.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
start=${CI_START:-$(date +%s)}
step() { printf '\n== [pure] %s (%ds)\n' "$*" $(( $(date +%s) - start )); }

step "builds without cgo (the NVML probe is cgo-only)"
CGO_ENABLED=0 go build ./...

step "the collectives' correctness matrix at 1,000,003 elements (too slow under -race)"
GYRE_LONG_TESTS=1 go test -count=1 -run '^TestLongMatrix$' ./ring/

step "the synthetic task is learnable and not linear (internal/mlp: numerics that build without -race only)"
go test -count=1 -run '^TestTaskIsValid$' ./internal/mlp/

step "recovery simulator: every second fault at every message step up to 5 ranks (20 steps for 6 and 7), boundaries interrupted, and 20,000 random schedules of 1 to 3 faults up to 8 ranks"
GYRE_LONG_TESTS=1 go test -count=1 -timeout 30m ./internal/recovery/

step "fuzz the frame decoder"
# Count budgets, not durations: with a duration, Go 1.26's fuzzing
# coordinator can fail a clean run with a bare "context deadline exceeded"
# as the time runs out (golang/go#75804, fixed in Go 1.27). A count has no
# deadline to race. The counts take about 5-12 s each on 2 cores.
for target in FuzzDecode FuzzReadMessage FuzzReadHello; do
  go test -run '^$' -fuzz "^${target}\$" -fuzztime 500000x ./internal/wire
done
go test -run '^$' -fuzz '^FuzzMeta$' -fuzztime 100000x ./membership
go test -run '^$' -fuzz '^FuzzDecode$' -fuzztime 100000x ./internal/recovery

step "pure steps done"
