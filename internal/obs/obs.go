// Package obs is what the runtime reports about itself, and the writers
// that turn the reports into something to look at: Prometheus metrics for
// now. The runtime calls an Observer, given in gyre.Config, never a
// global, so two workers in one process report apart.
//
// Observers are called on the runtime's own goroutines, on its hot path
// for collectives: they must be quick, must not block and, for
// collectives, must not allocate.
package obs

import (
	"time"

	"github.com/gyre-ml/gyre/ring"
)

// Observer receives the runtime's reports.
type Observer interface {
	// Collective is called when a collective on the data channel ends.
	ring.Observer
	// Boundary is called when an iteration boundary returns.
	Boundary(Boundary)
}

// Boundary describes one iteration boundary as one worker saw it.
type Boundary struct {
	// Iter is the iteration the boundary ended; Next the one to run
	// next (Iter+1, or an earlier commit's after a recovery).
	Iter, Next int64
	// Duration is the boundary's own wall time: the vote, and any view
	// change, probe or recovery it ran.
	Duration time.Duration
	// Compute is this worker's compute time in the iteration, from its
	// start to the first Wait.
	Compute time.Duration
	// Err is the boundary's error, nil if it returned a change.
	Err error
	// The view the next iteration runs in: its epoch, this worker's rank,
	// the members' names in rank order and their shares. Slices are the
	// runtime's own: an Observer must copy what it keeps.
	Epoch       uint64
	Rank        int
	Members     int
	MemberNames []string
	Shares      []int
	// Computes are the compute times every rank reported for the
	// iteration just ended, in the ranks of the view it ran in; nil when
	// the boundary failed or changed the view.
	Computes []time.Duration
	// Pending is how many joiners gossip listed, not yet in a view, when
	// the boundary voted (0 without gossip).
	Pending int
	// ViewChanged, SharesChanged and Redo are those of the change
	// returned (see gyre.Change); Redo marks a recovery, which redoes the
	// iterations since the last commit.
	ViewChanged, SharesChanged, Redo bool
}

// SpanObserver is an Observer that also takes the trainer's spans
// (gyre.Worker.StartSpan): forward, backward, step, eval.
type SpanObserver interface {
	Span(kind string, iter int64, start, end time.Time)
}

// StallObserver is an Observer that also takes stall reports: a
// collective this worker waits in past the stall threshold.
type StallObserver interface {
	Stall(Stall)
}

// Stall is one stall report, as one waiting worker makes it.
type Stall struct {
	// Collective says which: "gradients" for the buckets' allreduces,
	// "data" for other collectives on the data channel (the trainer's
	// own, state broadcasts), "control" for the control channel's votes
	// and barriers, whose Step is "join", "boundary" or "leave".
	Collective, Step string
	// Op is the operation (ring.Algo.Op), Bytes its buffer's size.
	Op    string
	Bytes int
	// Epoch, Iter and Begun locate it: the view, the iteration, and the
	// number of collectives this worker had begun in the epoch.
	Epoch uint64
	Iter  int64
	Begun uint64
	// Waited is how long the worker has waited in it.
	Waited time.Duration
	// Rank is the reporting worker's.
	Rank int
	// Behind are the ranks whose heartbeats say they have not reached
	// it, and Unknown those from which no heartbeat with progress has
	// come since it began.
	Behind, Unknown []int
	// Pending are the names of this worker's tensors not yet reduced.
	Pending []string
}

// Multi reports to every non-nil observer in turn; nil if there is none.
func Multi(observers ...Observer) Observer {
	var m multi
	for _, o := range observers {
		if o != nil {
			m = append(m, o)
		}
	}
	switch len(m) {
	case 0:
		return nil
	case 1:
		return m[0]
	}
	return m
}

type multi []Observer

func (m multi) Collective(s ring.CollectiveStats) {
	for _, o := range m {
		o.Collective(s)
	}
}

func (m multi) Boundary(b Boundary) {
	for _, o := range m {
		o.Boundary(b)
	}
}

func (m multi) Span(kind string, iter int64, start, end time.Time) {
	for _, o := range m {
		if so, ok := o.(SpanObserver); ok {
			so.Span(kind, iter, start, end)
		}
	}
}

func (m multi) Bucket(b ring.BucketStats) {
	for _, o := range m {
		if bo, ok := o.(ring.BucketObserver); ok {
			bo.Bucket(b)
		}
	}
}

func (m multi) Stall(s Stall) {
	for _, o := range m {
		if so, ok := o.(StallObserver); ok {
			so.Stall(s)
		}
	}
}
