package gyre_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// logsTo returns a logger that writes to t and to buf, at info level.
func logsTo(t *testing.T, buf *transporttest.LogBuffer) *zerolog.Logger {
	return new(zerolog.New(io.MultiWriter(zerolog.NewTestWriter(t), buf)).Level(zerolog.InfoLevel))
}

// trainWhile trains the toy on every worker of ws, pacing iterations
// 10 ms apart, until stop is closed and at least min iterations are done,
// then ends the job with Leave. It returns the workers' errors.
func trainWhile(ctx context.Context, ws []*gyre.Worker, models []*toy, min int64, stop <-chan struct{}) []error {
	return gyretest.Each(ws, func(r int, w *gyre.Worker) error {
		for {
			// The workers see stop close at different times, so they
			// agree through an allgather: go on while any of them is
			// below min or has not seen it.
			more := 0.0
			select {
			case <-stop:
			default:
				more = 1
			}
			if w.Iter() < min {
				more = 1
			}
			rows, err := w.AllGather64(ctx, []float64{more})
			if err != nil {
				return err
			}
			goOn := false
			for _, row := range rows {
				goOn = goOn || row[0] > 0
			}
			if !goOn {
				return w.Leave(ctx)
			}
			time.Sleep(10 * time.Millisecond)
			if err := trainStep(ctx, w, models[r]); err != nil {
				return err
			}
		}
	})
}

// TestUnreachableJoinerStaysPending: a joiner whose data address cannot
// be reached (it advertises a socket that drops everything) gossips in and
// dials every member, but no member can dial it back, so none lists it:
// it stays pending, each member names it in its log as one it cannot
// reach, the joiner names the members that have not answered, and the
// job trains on undisturbed.
func TestUnreachableJoinerStaysPending(t *testing.T) {
	t.Parallel()
	for _, tr := range []string{gyretest.QUIC, gyretest.TCP} {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			testUnreachableJoiner(t, tr)
		})
	}
}

func testUnreachableJoiner(t *testing.T, tr string) {
	const members = 3
	logs := make([]*transporttest.LogBuffer, members+1)
	models := make([]*toy, members+1)
	// The joiner is cancelled once the checks pass, so a long JoinTimeout
	// costs nothing; it is the margin the members' own start needs under
	// load (the link probes of a 3-member view over QUIC under -race,
	// beside other tests, once took longer than 8 s).
	c := gyretest.MakeCluster(t, gyretest.Options{N: members, Transport: tr, Gossip: true, JoinTimeout: 40 * time.Second,
		Unreachable: func(i int) bool { return i == members },
		Options:     func(int) []gyre.Option { return []gyre.Option{gyre.WithHandshakeNote(time.Second)} },
		Config: func(i int, c *gyre.Config) {
			logs[i] = &transporttest.LogBuffer{}
			c.Logger = logsTo(t, logs[i])
			c.GlobalBatch = 24
			c.Balance = gyre.BalanceStatic
		},
		State: func(i int) *gyre.State {
			models[i] = newToy()
			return models[i].state()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	joiner := c.AddJoiner(t)
	seen := make(chan struct{})
	go func() {
		defer close(seen)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			all := strings.Contains(logs[members].String(), "have not answered its admission request")
			for i := range members {
				all = all && strings.Contains(logs[i].String(), "a pending joiner is not admitted: this worker cannot reach its data address")
			}
			if all {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if err := errors.Join(trainWhile(ctx, c.Workers[:members], models, 50, seen)...); err != nil {
		t.Fatalf("the members: %v", err)
	}
	jid := string(c.IDs[members])
	for i := range members {
		if log := logs[i].String(); !strings.Contains(log, "a pending joiner is not admitted: this worker cannot reach its data address") ||
			!strings.Contains(log, `"joiner":"`+jid+`"`) || strings.Contains(log, `"admitted":["`+jid) {
			t.Fatalf("member %d's log does not name the unreachable joiner %s, or admits it:\n%s", i, jid, log)
		}
	}
	if log := logs[members].String(); !strings.Contains(log, "have not answered its admission request") ||
		!strings.Contains(log, string(c.IDs[0])) {
		t.Fatalf("the joiner's log does not name the members that cannot reach it:\n%s", log)
	}
	joiner.Cancel() // it has stayed pending as long as the members trained
	if _, err := joiner.Wait(c); err == nil || !strings.Contains(err.Error(), "pending") {
		t.Fatalf("the unreachable joiner's Join: %v, want it to have stayed pending", err)
	}
	gyretest.EnsureSameState(t, c.States[:members]...)
}

// TestMisfitJoinerIsRefused: a joiner whose registered state or batch
// settings differ from the job's is refused before admission, with the
// difference named on both sides; the job trains on and ends identical.
func TestMisfitJoinerIsRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		misfit     func(c *gyre.Config, m *toy) *gyre.State
		joiner, in string // the joiner's error and a member's log name the difference so
	}{
		{"tensor", func(c *gyre.Config, m *toy) *gyre.State {
			return gyre.NewState().Float64("theta", append(m.theta, 0))
		}, fmt.Sprintf(`state entry "theta" is float64[%d] here, float64[%d] in the job`, toyDim+1, toyDim),
			fmt.Sprintf(`state entry \"theta\" is float64[%d] on the joiner, float64[%d] in the job`, toyDim+1, toyDim)},
		{"batch", func(c *gyre.Config, m *toy) *gyre.State {
			c.GlobalBatch = 48
			return m.state()
		}, "setting GlobalBatch (--batch) is 48 here, 24 in the job",
			"setting GlobalBatch (--batch) is 48 on the joiner, 24 in the job"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const members = 3
			logs := make([]*transporttest.LogBuffer, members+1)
			models := make([]*toy, members+1)
			var joinerState *gyre.State
			c := gyretest.MakeCluster(t, gyretest.Options{N: members, Gossip: true,
				Config: func(i int, c *gyre.Config) {
					logs[i] = &transporttest.LogBuffer{}
					c.Logger = logsTo(t, logs[i])
					c.GlobalBatch = 24
					models[i] = newToy()
					if i == members {
						joinerState = tc.misfit(c, models[i])
					}
				},
				State: func(i int) *gyre.State {
					if i == members {
						return joinerState
					}
					return models[i].state()
				}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			joiner := c.AddJoiner(t)
			refused := make(chan struct{})
			var jerr error
			go func() {
				_, jerr = joiner.Wait(c)
				close(refused)
			}()
			if err := errors.Join(trainWhile(ctx, c.Workers[:members], models, 20, refused)...); err != nil {
				t.Fatalf("the members: %v", err)
			}
			if !errors.Is(jerr, gyre.ErrDiverged) || !strings.Contains(jerr.Error(), tc.joiner) {
				t.Fatalf("the misfit joiner's Join: %v; want ErrDiverged saying %q", jerr, tc.joiner)
			}
			// The joiner names the member whose answer it got first; that
			// one, at least, logged why.
			refuser := -1
			for i := range members {
				if strings.Contains(jerr.Error(), "(member "+string(c.IDs[i])+" ") {
					refuser = i
				}
			}
			if refuser < 0 {
				t.Fatalf("the joiner's error names no member: %v", jerr)
			}
			if log := logs[refuser].String(); !strings.Contains(log, "refused a joiner that does not fit the job: "+tc.in) {
				t.Fatalf("member %d refused the joiner but its log does not say why (%q):\n%s", refuser, tc.in, log)
			}
			gyretest.EnsureSameState(t, c.States[:members]...)
		})
	}
}
