package integration

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// TestTwoStartedJobsMerge: two jobs of one key and name start apart (the
// second seed is contacted by nobody within its start window), each with
// a joiner; then gyre members, given a seed of each, joins their gossip
// into one cluster. The view behind, the second, yields: its members log
// the iterations they discard and join the first job as new members, and
// all four workers end at the last iteration with one digest. A second job
// with another global batch yields too, but its members do not fit the
// first job: they are refused, and exit with the difference.
func TestTwoStartedJobsMerge(t *testing.T) {
	longOnly(t)
	for _, tc := range []struct {
		name   string
		batchB string
	}{{"fits", "256"}, {"misfit", "128"}} {
		t.Run(tc.name, func(t *testing.T) { testTwoStartedJobsMerge(t, tc.batchB) })
	}
}

func testTwoStartedJobsMerge(t *testing.T, batchB string) {
	const iters = 4000
	gyre := gyretest.Gyre(t)
	argv := func(batch string) func(int) []string {
		return func(int) []string {
			return []string{gyre, "--log-level", "info", "--log-format", "json", "train", "--iters", strconv.Itoa(iters),
				"--target-acc", "0", "--eval-every", "1000", "--log-positions", "--batch", batch}
		}
	}
	key := gyretest.Key(t)
	a := startSeed(t, 1, argv("256"), key)
	a.Add(t)
	waitForCommit(t, a, 0, 200, time.Minute)
	b := startSeed(t, 1, argv(batchB), key)
	b.Add(t)
	waitForCommit(t, b, 1, 1, time.Minute)
	if strings.Contains(b.Stderr(0), "joining it as a new member rather than starting a second job") {
		t.Fatal("the second seed joined the first job: the jobs never ran apart")
	}

	bridged := time.Now()
	bridge := exec.Command(gyre, "--log-level", "warn", "members", "--seed", a.GossipAddrs[0], "--seed", b.GossipAddrs[0], "--wait", "500ms")
	bridge.Env = append(os.Environ(), "GYRE_KEY="+key)
	if out, err := bridge.CombinedOutput(); err != nil {
		t.Fatalf("gyre members with a seed of each job: %v\n%s", err, out)
	}
	const yielded = "ranks above this one"
	waitFor(t, 20*time.Second, "the second job to yield", func() bool {
		return strings.Contains(b.Stderr(0), yielded) && strings.Contains(b.Stderr(1), yielded)
	})
	t.Logf("the second job yielded %v after the bridge started", time.Since(bridged).Round(time.Millisecond))

	resA, resB := waitAll(t, a, 3*time.Minute), waitAll(t, b, 3*time.Minute)
	digest := finalDigests(t, resA, iters)
	for _, r := range resA {
		if strings.Contains(r.Stderr, yielded) {
			t.Errorf("process %d of the first job, ahead, yielded:\n%s", r.Rank, r.Stderr)
		}
	}
	if batchB != "256" {
		for _, r := range resB {
			if r.Code == 0 || !strings.Contains(r.Stderr, "GlobalBatch") {
				t.Errorf("process %d of the second job, a misfit, exited %d; want an error naming the batch:\n%s", r.Rank, r.Code, r.Stderr)
			}
			if i := strings.LastIndex(r.Stderr, "Error: "); i >= 0 {
				t.Logf("process %d of the second job: %s", r.Rank, strings.TrimSpace(r.Stderr[i:]))
			}
		}
		return
	}
	if d := finalDigests(t, resB, iters); d != digest {
		t.Fatalf("the second job's workers ended with digest %s, the first's %s", d, digest)
	}
	for _, r := range resB {
		if !strings.Contains(r.Stdout, "rejoined as a new member") {
			t.Errorf("process %d of the second job did not say it joined the first:\n%s", r.Rank, r.Stdout)
		}
	}
}
