package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// The elastic-membership tests: real gyre train processes that find each
// other by gossip (real memberlist over loopback) from one seed.

var (
	digestLine = regexp.MustCompile(`(?m)^# rank (\d+) final state digest ([0-9a-f]{16}) at iteration (\d+)$`)
	leftLine   = regexp.MustCompile(`(?m)^# left the job after iteration (\d+), as asked; final state digest [0-9a-f]{16}$`)
	progress   = regexp.MustCompile(`(?m)^ +(\d+) +[0-9.]+ +[0-9.]+% +\d+  [0-9,]+$`)
)

// longOnly skips a test outside the GYRE_LONG_TESTS step, saying why.
func longOnly(t *testing.T) {
	t.Helper()
	if os.Getenv("GYRE_LONG_TESTS") != "1" {
		t.Skip("multi-process membership scenario: runs in the GYRE_LONG_TESTS step of CI (GYRE_LONG_TESTS=1)")
	}
}

// trainArgv is gyre train with a small model and many iterations, so that
// a run lasts long enough for the test to act on it.
func trainArgv(gyre string, iters int) func(int) []string {
	return func(int) []string {
		return []string{gyre, "--log-level", "info", "--log-format", "json", "train", "--iters", strconv.Itoa(iters),
			"--target-acc", "0", "--hidden", "16", "--batch", "48", "--eval-every", "20"}
	}
}

// waitFor polls cond until it holds or limit passes.
func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up after %v waiting for %s", limit, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// finalDigests checks that every result but those in skip exited 0 at
// iteration iters with one digest, and returns it.
func finalDigests(t *testing.T, res []gyretest.Result, iters int, skip ...int) string {
	t.Helper()
	var digest string
	for _, r := range res {
		if contains(skip, r.Rank) {
			continue
		}
		m := digestLine.FindStringSubmatch(r.Stdout)
		switch {
		case r.Code != 0:
			t.Fatalf("process %d exited %d:\n%s", r.Rank, r.Code, r.Stderr)
		case m == nil || m[3] != strconv.Itoa(iters):
			t.Fatalf("process %d printed no final digest at iteration %d:\n%s", r.Rank, iters, r.Stdout)
		case digest != "" && m[2] != digest:
			t.Fatalf("process %d ended with digest %s, others %s", r.Rank, m[2], digest)
		}
		digest = m[2]
	}
	return digest
}

func contains(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestGossipJoinAndGracefulLeave (in the race-enabled suite): 4 gyre
// train processes join through one seed and form one view; SIGTERM of one
// makes it leave at the next boundary and exit 0, and the other 3 carry on
// to the end with no iteration redone and identical final states.
func TestGossipJoinAndGracefulLeave(t *testing.T) {
	// Long enough to outlast gyre members and the signal even when small
	// collectives are fast: at 1500 the job once ended first.
	const iters = 5000
	key := gyretest.Key(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 4, Gossip: true, Argv: trainArgv(gyretest.Gyre(t), iters),
		Key: func(int) string { return key }})
	waitFor(t, time.Minute, "the 4 workers to start training", func() bool {
		return strings.Contains(p.Stdout(0), "4 workers") && progress.MatchString(p.Stdout(0))
	})
	checkMembers(t, key, p.GossipAddrs[1], p.Peers)
	p.Term(t, 2)
	res := waitAll(t, p, 2*time.Minute)
	leaver := res[2]
	m := leftLine.FindStringSubmatch(leaver.Stdout)
	if leaver.Code != 0 || m == nil {
		t.Fatalf("the leaver exited %d without saying it left:\n%s\n%s", leaver.Code, leaver.Stdout, leaver.Stderr)
	}
	if at, _ := strconv.Atoi(m[1]); at >= iters-1 {
		t.Fatalf("the leaver left only at iteration %d of %d", at, iters)
	}
	finalDigests(t, res, iters, 2)
	for _, r := range []int{0, 1, 3} {
		if strings.Contains(res[r].Stderr, `"redo"`) || !strings.Contains(res[r].Stderr, `"left":["`+p.Peers[2]) {
			t.Fatalf("process %d did not log the leave of %s:\n%s", r, p.Peers[2], res[r].Stderr)
		}
		if strings.Contains(res[r].Stderr, "observer-") {
			t.Fatalf("process %d logged the observer:\n%s", r, res[r].Stderr)
		}
	}
}

// checkMembers runs gyre members through seed until it lists the workers
// at dataAddrs (by rank) alive, in one epoch and none pending, which
// gossip of the metadata reaches within seconds.
func checkMembers(t *testing.T, key, seed string, dataAddrs []string) {
	t.Helper()
	var last string
	for range 10 {
		cmd := exec.Command(gyretest.Gyre(t), "--log-level", "warn", "members", "--seed", seed, "--json", "--wait", "500ms")
		cmd.Env = append(os.Environ(), "GYRE_KEY="+key)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("gyre members: %v\nstdout:\n%s\nstderr:\n%s", err, out, stderr.String())
		}
		last = string(out)
		var rows []struct {
			ID, State, Role string
			DataAddr        string `json:"data_addr"`
			Epoch           uint64
			Rank            int
			Pending         bool
		}
		if err := json.Unmarshal(out, &rows); err != nil {
			t.Fatalf("gyre members --json: %v\n%s", err, out)
		}
		ok := len(rows) == len(dataAddrs)
		for i, r := range rows {
			ok = ok && r.Rank == i && r.DataAddr == dataAddrs[i] && r.State == "alive" && r.Role == "worker" &&
				!r.Pending && r.Epoch >= 1 && r.Epoch == rows[0].Epoch
		}
		if ok {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("gyre members never listed the %d workers in one epoch; last:\n%s", len(dataAddrs), last)
}

// TestWrongKeyNeverJoins: a worker whose cluster secret differs cannot
// join gossip; it fails saying why, the job is unaffected, and the seed's
// log says why too.
func TestWrongKeyNeverJoins(t *testing.T) {
	const iters = 400
	good := gyretest.Key(t)
	bad := gyretest.Key(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 2, Gossip: true, Argv: trainArgv(gyretest.Gyre(t), iters),
		Key: func(r int) string {
			if r == 2 {
				return bad
			}
			return good
		}})
	waitFor(t, time.Minute, "the job to start", func() bool { return progress.MatchString(p.Stdout(0)) })
	intruder := p.Add(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r := p.WaitRank(ctx, intruder)
	if r.Code == 0 || !strings.Contains(r.Stderr, "cluster secret") {
		t.Fatalf("the worker with the wrong key exited %d:\n%s", r.Code, r.Stderr)
	}
	res := waitAll(t, p, 2*time.Minute)
	finalDigests(t, res[:2], iters)
	if !regexp.MustCompile(`(?i)decrypt|no installed keys`).MatchString(res[0].Stderr) {
		t.Fatalf("the seed's log does not say why it refused the intruder:\n%s", res[0].Stderr)
	}
}

// TestGossipJoinEight: 8 gyre train processes join through one seed, form
// one view and train to the end with identical final states.
func TestGossipJoinEight(t *testing.T) {
	longOnly(t)
	const iters = 300
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 8, Gossip: true, Argv: trainArgv(gyretest.Gyre(t), iters)})
	res := waitAll(t, p, 4*time.Minute)
	finalDigests(t, res, iters)
	if !strings.Contains(res[0].Stdout, "# gyre train: 8 workers") {
		t.Fatalf("rank 0 did not start with all 8 workers:\n%s", res[0].Stdout)
	}
}

// lossArgv is gyre train with a larger batch, whose training is tame
// enough that runs with different numbers of workers (summing in other
// orders) keep losses within 1e-12 of each other for thousands of
// iterations, each process writing its metrics to dir/metrics-INDEX.jsonl.
// Balancing is off: shares that follow the machine's noise would make the
// runs differ for no reason of the membership's.
func lossArgv(gyre, dir string, iters int) func(int) []string {
	return func(r int) []string {
		return []string{gyre, "--log-level", "info", "--log-format", "json", "train", "--iters", strconv.Itoa(iters),
			"--target-acc", "0", "--hidden", "32", "--batch", "512", "--eval-every", "100", "--balance", "static",
			"--metrics-file", filepath.Join(dir, fmt.Sprintf("metrics-%d.jsonl", r))}
	}
}

// readLosses reads the losses of a --metrics-file.
func readLosses(t *testing.T, path string) map[int]float64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	losses := make(map[int]float64)
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var m struct {
			Iter int
			Loss float64
		}
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: %q: %v", path, line, err)
		}
		losses[m.Iter] = m.Loss
	}
	return losses
}

// TestElasticJoin: a 5th gyre train started with --seed while 4 train is
// admitted at a boundary, ends with everyone's digest, and the job's
// losses, before and after it joined, stay within 1e-12 relative of a
// single worker's uninterrupted run with the same global batch.
func TestElasticJoin(t *testing.T) {
	longOnly(t)
	const iters = 3000
	dir := t.TempDir()
	gyre := gyretest.Gyre(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 4, Gossip: true, Argv: lossArgv(gyre, dir, iters)})
	waitFor(t, time.Minute, "the 4 workers to start training", func() bool { return progress.MatchString(p.Stdout(0)) })
	added := time.Now()
	j := p.Add(t, p.GossipAddrs[1])
	waitFor(t, time.Minute, "the joiner to be admitted", func() bool { return strings.Contains(p.Stderr(j), `"admitted"`) })
	t.Logf("the joiner was admitted %v after it started", time.Since(added).Round(time.Millisecond))
	res := waitAll(t, p, 4*time.Minute)
	finalDigests(t, res, iters)
	for r := range 4 {
		if !strings.Contains(res[r].Stderr, `"admitted":["`+p.Peers[j]) {
			t.Fatalf("process %d did not log admitting %s:\n%s", r, p.Peers[j], res[r].Stderr)
		}
	}

	ref := exec.Command(lossArgv(gyre, dir, iters)(99)[0], lossArgv(gyre, dir, iters)(99)[1:]...)
	ref.Env = withoutGyreVars()
	if out, err := ref.CombinedOutput(); err != nil {
		t.Fatalf("the single-worker reference run: %v\n%s", err, out)
	}
	want := readLosses(t, filepath.Join(dir, "metrics-99.jsonl"))
	for r := range res {
		got := readLosses(t, filepath.Join(dir, fmt.Sprintf("metrics-%d.jsonl", r)))
		first := iters
		for it, loss := range got {
			first = min(first, it)
			if rel := math.Abs(loss-want[it]) / math.Abs(want[it]); !(rel <= 1e-12) {
				t.Fatalf("process %d, iteration %d: loss %.17g, the reference %.17g (relative difference %.2g)", r, it, loss, want[it], rel)
			}
		}
		switch {
		case r < 4 && (first != 0 || len(got) != iters):
			t.Fatalf("process %d logged %d losses from iteration %d, want all %d", r, len(got), first, iters)
		case r == j && (first == 0 || len(got) != iters-first):
			t.Fatalf("the joiner logged %d losses from iteration %d", len(got), first)
		}
	}
}

// withoutGyreVars is this process's environment without GYRE_* variables.
func withoutGyreVars() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GYRE_") {
			env = append(env, kv)
		}
	}
	return env
}

// TestSeedLeaves: SIGTERM of the seed, after the others joined through
// it, leaves the job to the other 3, who train on; a new worker then joins
// through another member's gossip address, and all 4 end identical.
func TestSeedLeaves(t *testing.T) {
	longOnly(t)
	const iters = 4000
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 4, Gossip: true, Argv: trainArgv(gyretest.Gyre(t), iters)})
	waitFor(t, time.Minute, "the 4 workers to start training", func() bool { return progress.MatchString(p.Stdout(0)) })
	p.Term(t, 0)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seed := p.WaitRank(ctx, 0)
	if m := leftLine.FindStringSubmatch(seed.Stdout); seed.Code != 0 || m == nil {
		t.Fatalf("the seed exited %d without saying it left:\n%s\n%s", seed.Code, seed.Stdout, seed.Stderr)
	}
	j := p.Add(t, p.GossipAddrs[2])
	res := waitAll(t, p, 4*time.Minute)
	finalDigests(t, res, iters, 0)
	for _, r := range []int{1, 2, 3} {
		if strings.Contains(res[r].Stderr, `"redo"`) || !strings.Contains(res[r].Stderr, `"left":["`+p.Peers[0]) ||
			!strings.Contains(res[r].Stderr, `"admitted":["`+p.Peers[j]) {
			t.Fatalf("process %d did not log the seed's leave and the joiner's admission:\n%s", r, res[r].Stderr)
		}
	}
}
