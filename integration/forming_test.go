package integration

import (
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
