package integration

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// The join tests: real gyre train processes joining a job in the ways
// that used to kill it.

// joinRuns is how many times each join scenario repeats: once in the
// race-enabled suite, 20 times with GYRE_LONG_TESTS, or GYRE_JOIN_RUNS
// times if set (CI runs fewer, to keep within its time).
func joinRuns() int {
	if n, err := strconv.Atoi(os.Getenv("GYRE_JOIN_RUNS")); err == nil && n > 0 && longTests() {
		return n
	}
	if longTests() {
		return 20
	}
	return 1
}

// startSeed starts a job of one gyre train process, gossiping alone with
// --min-workers min (as README's by-hand start), and waits until it
// listens, so that joiners find it on their first try. key is the job's
// cluster secret. Every process of
// the job runs argv, with memberlist's LAN timing, as by hand (gyre
// launch uses the local one).
func startSeed(t *testing.T, min int, argv func(int) []string, key string) *gyretest.Procs {
	t.Helper()
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 1, Gossip: true, Argv: argv,
		Key: func(int) string { return key },
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
		p := startSeed(t, 3, argv, gyretest.Key(t))
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

// TestJoinStorm: 4 workers join a running seed at once, arriving mid-run,
// with gyre members polling the job throughout or not; the job never
// fails, and all 5 end with one digest.
func TestJoinStorm(t *testing.T) {
	polls := []bool{true} // the storm, with gyre members polling through it
	if longTests() {
		polls = []bool{false, true} // and without
	}
	for _, members := range polls {
		t.Run(map[bool]string{false: "quiet", true: "members polled"}[members], func(t *testing.T) {
			testJoinStorm(t, members)
		})
	}
}

func testJoinStorm(t *testing.T, poll bool) {
	// The seed alone runs over 1000 iterations a second; the joiners have
	// been admitted within the first 200 on a quiet machine, the 5
	// workers then take about 5 ms an iteration.
	const iters = 1500
	gyre := gyretest.Gyre(t)
	argv := trainArgv(gyre, iters)
	key := gyretest.Key(t)
	for run := range joinRuns() {
		p := startSeed(t, 1, argv, key)
		waitFor(t, time.Minute, "the seed to train", func() bool { return progress.MatchString(p.Stdout(0)) })
		stop := make(chan struct{})
		polled := make(chan int)
		seed := p.GossipAddrs[0] // read before Add grows the slice
		if poll {
			go func() {
				n := 0
				defer func() { polled <- n }()
				for {
					select {
					case <-stop:
						return
					default:
					}
					cmd := exec.Command(gyre, "--log-level", "error", "members", "--seed", seed, "--json", "--wait", "200ms")
					cmd.Env = append(os.Environ(), "GYRE_KEY="+key)
					if out, err := cmd.CombinedOutput(); err == nil {
						n++
					} else {
						t.Logf("gyre members: %v\n%s", err, out)
					}
				}
			}()
		}
		var joiners []int
		for range 4 {
			joiners = append(joiners, p.Add(t))
		}
		res := waitAll(t, p, 4*time.Minute)
		close(stop)
		if poll {
			if n := <-polled; n == 0 {
				t.Fatal("gyre members never answered")
			}
		}
		finalDigests(t, res, iters)
		for _, j := range joiners {
			if !strings.Contains(res[j].Stderr, `"admitted"`) {
				t.Fatalf("run %d: joiner %d was never admitted:\n%s", run, j, res[j].Stderr)
			}
		}
		t.Logf("run %d: 4 joiners admitted at iterations %v of %d, 5 workers ended with one digest", run, admittedAt(t, res[0].Stderr), iters)
	}
}

// TestMisfitJoinerByHand: a joiner started with another --hidden, and one
// with another --batch, are each refused before admission with a message
// naming the difference, on the joiner and on the member that refused
// it; the job trains on and ends with one digest.
func TestMisfitJoinerByHand(t *testing.T) {
	const iters = 3000
	gyre := gyretest.Gyre(t)
	for _, tc := range []struct {
		name           string
		flags          []string
		joiner, member string
	}{
		{"hidden", []string{"--hidden", "32"}, `state entry "layer0" is float64[1056] here, float64[528] in the job`,
			`state entry \"layer0\" is float64[1056] on the joiner, float64[528] in the job`},
		{"batch", []string{"--batch", "96"}, "setting GlobalBatch (--batch) is 96 here, 48 in the job",
			"setting GlobalBatch (--batch) is 96 on the joiner, 48 in the job"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			argv := func(r int) []string {
				a := trainArgv(gyre, iters)(r)
				if r == 2 {
					a = append(a, tc.flags...)
				}
				return a
			}
			p := startSeed(t, 2, argv, gyretest.Key(t))
			p.Add(t)
			// Rank 0, which prints the progress, is either process.
			waitFor(t, time.Minute, "the job to train", func() bool { return progress.MatchString(p.Stdout(0) + p.Stdout(1)) })
			misfit := p.Add(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			r := p.WaitRank(ctx, misfit)
			if r.Code == 0 || !strings.Contains(r.Stderr, "the job refused this worker") || !strings.Contains(r.Stderr, tc.joiner) {
				t.Fatalf("the misfit joiner exited %d; want it refused saying %q:\n%s", r.Code, tc.joiner, r.Stderr)
			}
			if !strings.Contains(p.Stderr(0)+p.Stderr(1), "refused a joiner that does not fit the job: "+tc.member) {
				t.Fatalf("no member logged why it refused the joiner (%q):\n%s\n%s", tc.member, p.Stderr(0), p.Stderr(1))
			}
			if done := digestLine.MatchString(p.Stdout(0) + p.Stdout(1)); done {
				t.Fatal("the job ended before the misfit joiner was refused; the test proves nothing")
			}
			res := waitAll(t, p, 4*time.Minute)
			finalDigests(t, res[:2], iters)
		})
	}
}

// TestStaticLeave: in a static 3-worker job over QUIC, one worker asks to
// leave (SIGTERM): it leaves at the next boundary and exits 0, and the
// other two go on as a smaller static view at the next epoch and end with
// one digest. The leaver says farewell before it closes, so none of its
// last messages is lost.
func TestStaticLeave(t *testing.T) {
	const iters, leaver = 60, 1
	gyre := gyretest.Gyre(t)
	for run := range joinRuns() {
		// A model whose iterations take tens of milliseconds, so that
		// the leave lands mid-run.
		p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 3, Argv: func(int) []string {
			return []string{gyre, "--log-level", "info", "--log-format", "json", "train", "--iters", strconv.Itoa(iters),
				"--target-acc", "0", "--eval-every", "20", "--hidden", "512", "--batch", "1536"}
		}})
		waitFor(t, time.Minute, "the leaver to join", func() bool { return strings.Contains(p.Stderr(leaver), `"joined"`) })
		p.Term(t, leaver)
		res := waitAll(t, p, 2*time.Minute)
		m := leftLine.FindStringSubmatch(res[leaver].Stdout)
		if res[leaver].Code != 0 || m == nil {
			t.Fatalf("run %d: the leaver exited %d without saying it left:\n%s\n%s", run, res[leaver].Code, res[leaver].Stdout, res[leaver].Stderr)
		}
		finalDigests(t, res, iters, leaver)
		for _, r := range []int{0, 2} {
			if !strings.Contains(res[r].Stderr, `"left":["`+p.Peers[leaver]) {
				t.Fatalf("run %d: rank %d did not log the leave:\n%s", run, r, res[r].Stderr)
			}
		}
		t.Logf("run %d: rank %d left after iteration %s; the other two ended with one digest", run, leaver, m[1])
	}
}

// admittedAt returns the iterations at which a worker's JSON log says
// its view admitted joiners.
func admittedAt(t *testing.T, log string) []int64 {
	t.Helper()
	var at []int64
	for _, l := range strings.Split(log, "\n") {
		var line struct {
			Iter     int64    `json:"iter"`
			Admitted []string `json:"admitted"`
		}
		if json.Unmarshal([]byte(l), &line) == nil && len(line.Admitted) > 0 {
			at = append(at, line.Iter)
		}
	}
	return at
}
