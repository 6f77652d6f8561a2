package train

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/mlp"
)

// eventLog keeps each worker's events.
type eventLog struct {
	mu     sync.Mutex
	events map[int][]Event
}

func (l *eventLog) on(r int) func(Event) {
	return func(e Event) {
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.events == nil {
			l.events = map[int][]Event{}
		}
		l.events[r] = append(l.events[r], e)
	}
}

func (l *eventLog) of(r int) []Event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.events[r]
}

// TestEventsJoinedAndViewChanged: every worker reports its join; when a
// worker leaves, the others report the view change, which rank 0 leads.
func TestEventsJoinedAndViewChanged(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	jobs := make([]*Job, 3)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3,
		Config: func(_ int, c *gyre.Config) { c.GlobalBatch = 48 },
		State: func(r int) *gyre.State {
			jobs[r] = smallJob(t)
			return jobs[r].State()
		}})
	var log eventLog
	errs := c.Run(func(r int, w *gyre.Worker) error {
		o := Options{Iters: 6, EvalEvery: 6, TestSize: 50, OnEvent: log.on(r)}
		if r == 2 {
			o.OnIteration = func(it Iteration) {
				if it.Iter == 2 {
					w.RequestLeave()
				}
			}
		}
		_, err := Run(ctx, w, jobs[r], o)
		return err
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for r := range 3 {
		ev := log.of(r)
		want := fmt.Sprintf("rank %d/3 joined at iteration 0 (epoch 1) as %s", r, c.IDs[r])
		if len(ev) == 0 || ev[0].Kind != Joined || ev[0].String() != want || !ev[0].Lead() {
			t.Fatalf("rank %d's first event %v, want %q", r, ev, want)
		}
	}
	if ev := log.of(2); len(ev) != 1 {
		t.Fatalf("the leaver reported %v after its join", ev[1:])
	}
	for r := range 2 {
		ev := log.of(r)
		want := "view changed at iteration 4: epoch 2, 2 workers, departed " + string(c.IDs[2])
		if len(ev) != 2 || ev[1].Kind != ViewChanged || ev[1].String() != want || ev[1].Lead() != (r == 0) {
			t.Fatalf("rank %d's events %v, want the view change %q, led by rank 0", r, ev, want)
		}
	}
}

// TestEventsLost: the workers that lose a peer report it, rank 0 leading,
// and Run returns the loss.
func TestEventsLost(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	jobs := make([]*Job, 3)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3,
		Config: func(_ int, c *gyre.Config) { c.GlobalBatch = 48; c.PeerTimeout = 500 * time.Millisecond },
		State: func(r int) *gyre.State {
			jobs[r] = smallJob(t)
			return jobs[r].State()
		}})
	var log eventLog
	errs := c.Run(func(r int, w *gyre.Worker) error {
		o := Options{Iters: 1000, EvalEvery: 1000, TestSize: 50, OnEvent: log.on(r)}
		if r == 2 {
			o.OnIteration = func(it Iteration) {
				if it.Iter == 2 {
					c.Kill(t, 2)
				}
			}
		}
		_, err := Run(ctx, w, jobs[r], o)
		return err
	})
	for r := range 2 {
		if !errors.Is(errs[r], gyre.ErrPeerLost) {
			t.Fatalf("rank %d: %v, want the loss of rank 2", r, errs[r])
		}
		ev := log.of(r)
		last := ev[len(ev)-1]
		t.Logf("rank %d: %s", r, last)
		if last.Kind != Lost || !strings.HasPrefix(last.String(), fmt.Sprintf("lost rank 2 (%s) in iteration ", c.IDs[2])) ||
			last.Lead() != (r == 0) || last.Rank != r {
			t.Fatalf("rank %d's events %v, want the loss of rank 2, led by rank 0", r, ev)
		}
	}
}

// smallJob is a small job, for tests of a few iterations.
func smallJob(t *testing.T) *Job {
	t.Helper()
	j, err := NewSizedJob([]int{mlp.InputDim, 16, mlp.NumClasses}, mlp.DefaultLR, 1, 7)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

// TestEventRejoinedAndPromoted: a worker the job went on without says so
// on its own console when it is back, and a view change that only makes
// the last joiners voters says that, not a bare epoch.
func TestEventRejoinedAndPromoted(t *testing.T) {
	promoted := Event{Kind: ViewChanged, Iter: 7, Epoch: 3, World: 3}
	if s := promoted.String(); !strings.HasSuffix(s, "now count for a majority") {
		t.Errorf("a view change with nobody admitted or departed reads %q; want it to say the joiners now vote", s)
	}
	back := Event{Kind: Rejoined, Iter: 1600, Epoch: 5, Rank: 1, World: 3, ID: "w-b"}
	if s := back.String(); !back.Lead() || !strings.HasPrefix(s, "rank 1/3 rejoined as a new member") || !strings.Contains(s, "iteration 1600") {
		t.Errorf("rejoined worker's event %q (lead %v), want it to say so and show", s, back.Lead())
	}
}

// TestEventStalledWorker: a worker that was itself unresponsive reports
// that on its own line, naming itself rather than the peer it found
// silent; an ordinary loss is reported by the lowest survivor alone.
func TestEventStalledWorker(t *testing.T) {
	stalled := Event{Kind: Lost, Iter: 9, Rank: 1, ID: "w-b", Err: &gyre.PeerLostError{Iter: 9, Rank: 0, Peer: "w-a",
		Err: errors.New("peer silent"), Unresponsive: 5 * time.Second, SelfRank: 1, Self: "w-b"}}
	if s := stalled.String(); !stalled.Lead() || !strings.HasPrefix(s, "rank 1 (w-b, this worker) was unresponsive for 5s in iteration 9") {
		t.Errorf("stalled worker's event %q (lead %v), want it to name itself and show", s, stalled.Lead())
	}
	lost := Event{Kind: Lost, Iter: 9, Rank: 1, ID: "w-b", Err: &gyre.PeerLostError{Iter: 9, Rank: 2, Peer: "w-c", Err: errors.New("peer silent")}}
	if s := lost.String(); lost.Lead() || s != "lost rank 2 (w-c) in iteration 9: peer silent" {
		t.Errorf("loss seen by rank 1: %q (lead %v), want rank 0 alone to show it", s, lost.Lead())
	}
}
