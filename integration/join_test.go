package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// The join tests: real gyre train processes joining a job in the ways
// that used to kill it.

// joinRuns is how many times each join scenario repeats: once in the
// race-enabled suite, 20 times in the GYRE_LONG_TESTS step.
func joinRuns() int {
	if longTests() {
		return 20
	}
	return 1
}

// startSeed starts a job of one gyre train process, gossiping alone with
// --min-workers min (as README's by-hand start), and waits until it
// listens, so that joiners find it on their first try. Every process of
// the job runs argv, with memberlist's LAN timing, as by hand (gyre
// launch uses the local one).
func startSeed(t *testing.T, min int, argv func(int) []string) *gyretest.Procs {
	t.Helper()
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 1, Gossip: true, Argv: argv,
		Env: func(r int) []string {
			env := []string{"GYRE_GOSSIP_TIMING=lan"}
			if r == 0 {
				env = append(env, "GYRE_MIN_WORKERS="+strconv.Itoa(min))
			}
			return env
		}})
	waitFor(t, time.Minute, "the seed to start the job", func() bool {
		return strings.Contains(p.Stderr(0), "started a new job")
	})
	return p
}

// TestReadmeByHand is README's by-hand start on one machine: a seed with
// --min-workers 3, then two joiners started together. Their gossip need
// not agree about each other when the seed admits them both; the job must
// train to the end all the same, with one final digest.
func TestReadmeByHand(t *testing.T) {
	const iters = 60
	argv := shortTrainArgv(gyretest.Gyre(t), iters)
	for run := range joinRuns() {
		p := startSeed(t, 3, argv)
		p.Add(t)
		p.Add(t)
		res := waitAll(t, p, 2*time.Minute)
		finalDigests(t, res, iters)
		t.Logf("run %d: 3 workers trained %d iterations", run, iters)
	}
}

// longTests reports whether this is CI's GYRE_LONG_TESTS step.
func longTests() bool { return os.Getenv("GYRE_LONG_TESTS") == "1" }

// shortTrainArgv is gyre train with its default model for iters
// iterations, logging JSON at info level for the test to read.
func shortTrainArgv(gyre string, iters int) func(int) []string {
	return func(int) []string {
		return []string{gyre, "--log-level", "info", "--log-format", "json", "train", "--iters", strconv.Itoa(iters),
			"--target-acc", "0", "--eval-every", "20"}
	}
}
