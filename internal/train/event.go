package train

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gyre-ml/gyre"
)

// EventKind says what an Event reports.
type EventKind int

// The membership events the trainer reports.
const (
	// Joined: this worker joined the job (Run starts).
	Joined EventKind = iota
	// ViewChanged: a boundary changed the view: workers were admitted or
	// departed.
	ViewChanged
	// Lost: a worker was lost and the job could not recover (a static
	// view, or no majority); Run returns the error.
	Lost
	// Recovered: the job lost workers and went on without them, from
	// the newest commit of the survivors (Iter).
	Recovered
	// Rejoined: the job recovered without this worker (it was stopped,
	// starved or cut off), and it came back as a new member, from the
	// job's newest commit (Iter).
	Rejoined
	// Resumed: the job started from a checkpoint (From).
	Resumed
)

// Event is a membership event: what a console shows between the rows of
// the table, one short line each.
type Event struct {
	Kind EventKind
	// Iter is the iteration to run next, or for Lost the one that failed
	// (-1: during Join).
	Iter  int64
	Epoch uint64
	// Rank and World are this worker's rank and the job's size after the
	// event; ID is this worker's ID.
	Rank, World int
	ID          string
	// Admitted and Departed name the workers that joined and left the view
	// (ViewChanged); Departed names the lost ones, and Pending the joiners
	// sent back to pending (Recovered, gyre.Change).
	Admitted, Departed, Pending []string
	// Err is the loss (Lost).
	Err *gyre.PeerLostError
	// From is the checkpoint the job resumed from (Resumed).
	From gyre.Resumed
}

// newEvent fills in what every event says of w.
func newEvent(kind EventKind, w *gyre.Worker) Event {
	v := w.View()
	return Event{Kind: kind, Iter: w.Iter(), Epoch: v.Epoch, Rank: w.Rank(), World: len(v.Members), ID: ID(w)}
}

// ID returns w's ID in the job: its entry in the view's members.
func ID(w *gyre.Worker) string {
	v, r := w.View(), w.Rank()
	if r < 0 || r >= len(v.Members) {
		return ""
	}
	return v.Members[r]
}

// lostEvent returns the Lost event of err, if err is a loss.
func lostEvent(w *gyre.Worker, err error) (Event, bool) {
	var pl *gyre.PeerLostError
	if !errors.As(err, &pl) {
		return Event{}, false
	}
	e := newEvent(Lost, w)
	e.Iter, e.Err = pl.Iter, pl
	return e, true
}

// Lead says whether this worker should show the event on a console the
// workers share (gyre launch's): each shows its own join, and rank 0 the
// job's view changes and losses (rank 1 the loss of rank 0).
func (e Event) Lead() bool {
	switch e.Kind {
	case Joined, Rejoined:
		return true
	case Lost:
		if e.Err != nil && e.Err.Unresponsive > 0 {
			return true // about itself: the others report its loss
		}
		lead := 0
		if e.Err != nil && e.Err.Rank == 0 {
			lead = 1
		}
		return e.Rank == lead
	}
	return e.Rank == 0
}

func (e Event) String() string {
	switch e.Kind {
	case Joined:
		return fmt.Sprintf("rank %d/%d joined at iteration %d (epoch %d) as %s", e.Rank, e.World, e.Iter, e.Epoch, e.ID)
	case ViewChanged:
		s := fmt.Sprintf("view changed at iteration %d: epoch %d, %d workers", e.Iter, e.Epoch, e.World)
		if len(e.Admitted) > 0 {
			s += ", admitted " + strings.Join(e.Admitted, " ")
		}
		if len(e.Departed) > 0 {
			s += ", departed " + strings.Join(e.Departed, " ")
		}
		if len(e.Admitted)+len(e.Departed) == 0 {
			s += "; the workers admitted last now count for a majority"
		}
		return s
	case Resumed:
		return fmt.Sprintf("resumed from checkpoint %s (epoch %d, iteration %d), held by rank %d (%s); %d workers",
			e.From.File, e.From.Epoch, e.From.Iter, e.From.Rank, e.From.ID, e.World)
	case Rejoined:
		return fmt.Sprintf("rank %d/%d rejoined as a new member (the job went on without it, or its view yielded to another view of the job): epoch %d, going on from iteration %d",
			e.Rank, e.World, e.Epoch, e.Iter)
	case Recovered:
		s := "recovered"
		if len(e.Departed) > 0 {
			s += " without " + strings.Join(e.Departed, " ")
		}
		s += fmt.Sprintf(": epoch %d, %d workers, going on from iteration %d", e.Epoch, e.World, e.Iter)
		if len(e.Pending) > 0 {
			s += "; the joiners it was admitting are pending again: " + strings.Join(e.Pending, " ")
		}
		return s
	case Lost:
		if e.Err.Unresponsive > 0 {
			return fmt.Sprintf("rank %d (%s, this worker) was unresponsive for %v in iteration %d, longer than the peer timeout: "+
				"the others will have declared it lost", e.Rank, e.ID, e.Err.Unresponsive.Round(time.Millisecond), e.Iter)
		}
		who := fmt.Sprintf("rank %d", e.Err.Rank)
		if e.Err.Rank < 0 {
			who = "a worker"
		}
		return fmt.Sprintf("lost %s (%s) in iteration %d: %v", who, e.Err.Peer, e.Iter, cause(e.Err))
	}
	return fmt.Sprintf("event %d", int(e.Kind))
}

// cause is the innermost error of err's chain: the short why of a loss,
// whose full chain the worker's error report has.
func cause(err error) error {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err
		}
		err = next
	}
}
