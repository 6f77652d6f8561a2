package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// TestLossBeforeIterationZero: README's by-hand start, a seed with
// --min-workers 3, loses the one joiner it has admitted before iteration
// 0, killed or giving up at its own --join-timeout. The seed forms the
// job's view again and keeps waiting; two joiners started after the loss
// are admitted, and the three train to the end with one digest.
func TestLossBeforeIterationZero(t *testing.T) {
	const iters = 60
	gyre := gyretest.Gyre(t)
	for _, tc := range []struct {
		name   string
		giveUp bool // the joiner gives up at --join-timeout, else it is killed
	}{{name: "killed"}, {name: "gives-up", giveUp: true}} {
		t.Run(tc.name, func(t *testing.T) {
			base := shortTrainArgv(gyre, iters)
			argv := func(r int) []string {
				a := base(r)
				if r == 1 && tc.giveUp {
					a = append(a, "--join-timeout", "6s")
				}
				return a
			}
			p := startSeed(t, 3, argv, gyretest.Key(t))
			first := p.Add(t)
			waitFor(t, time.Minute, "the first joiner's admission", func() bool {
				return strings.Contains(p.Stderr(first), `"message":"admitted"`)
			})
			if !tc.giveUp {
				p.Kill(t, first)
			}
			waitFor(t, time.Minute, "the seed to form the job's view again", func() bool {
				return strings.Contains(p.Stderr(0), "forming the job's view again")
			})
			p.Add(t)
			p.Add(t)
			res := waitAll(t, p, 2*time.Minute)
			finalDigests(t, res, iters, first)
			if r := res[first]; tc.giveUp && (r.Code <= 0 || !strings.Contains(r.Stderr, "--join-timeout")) {
				t.Errorf("the joiner that gave up exited %d; want an error naming --join-timeout:\n%s", r.Code, r.Stderr)
			}
		})
	}
}

// TestSeedRestartedByItsOwnCommand: README's first worker is killed
// while two joiners train with it, and started again with its own
// command; then a new worker joins through it. Started with no
// --min-workers, the restarted seed hears from the running job within
// its start window (the members join their dead seed again every 2 s);
// with --min-workers 3, as README starts it, its view assembles until
// gossip lists the started job, and then yields. Either way it joins
// the running job: one job, and all four end with one digest. Before, it
// started a second job, which the new worker joined.
func TestSeedRestartedByItsOwnCommand(t *testing.T) {
	longOnly(t)
	// Long enough to outlast gossip's memory of the seed's previous
	// incarnation: a seed restarted without seeds learns of it from the
	// members that rejoin it, and until it refutes it (here up to 15 s)
	// they read its old metadata and do not see it pending.
	const iters = 6000
	for _, min := range []int{1, 3} {
		t.Run(fmt.Sprint("min-workers=", min), func(t *testing.T) {
			p := startSeed(t, min, shortTrainArgv(gyretest.Gyre(t), iters), gyretest.Key(t))
			for range 2 {
				p.Add(t)
			}
			// A joiner admitted after iteration 0 votes in a recovery
			// only from the next boundary on (vote.PromoteJoiners); killed
			// before that, the seed would be the only voter, and the two
			// could not recover.
			waitFor(t, time.Minute, "the joiners' admission and first vote", func() bool {
				return votes(p.Stderr(1)) && votes(p.Stderr(2))
			})
			p.Kill(t, 0)
			waitFor(t, time.Minute, "the joiners' recovery", func() bool {
				return strings.Contains(p.Stderr(1), "recovered:") && strings.Contains(p.Stderr(2), "recovered:")
			})
			p.Restart(t, 0)
			waitFor(t, time.Minute, "the restarted seed to join a job or start one", func() bool {
				s := p.Stderr(0)
				return strings.Contains(s, `"message":"admitted"`) || strings.Contains(s, "started a new job")
			})
			p.Add(t)
			res := waitAll(t, p, 3*time.Minute)
			finalDigests(t, res, iters)
		})
	}
}

// votes reports whether a joiner's JSON log shows it a voter: admitted
// before iteration 0, or promoted at a boundary since.
func votes(log string) bool {
	for line := range strings.Lines(log) {
		if strings.Contains(line, `"joiners_vote":true`) ||
			strings.Contains(line, `"message":"admitted"`) && strings.Contains(line, `"iter":0,`) {
			return true
		}
	}
	return false
}
