package streams

import (
	"context"
	"errors"
	"sync"
)

// errReleased is returned by canceller.begin once the transport (or the
// peer) is gone; the caller reports ErrClosed or a PeerError.
var errReleased = errors.New("streams: released")

// canceller interrupts the call in progress on a (peer, channel) when its
// context ends, by running onCancel (which sets a past read deadline or
// closes the streams). It registers context.AfterFunc once per distinct
// context, not once per call: AfterFunc allocates, and Send and Recv must
// not allocate per message, while callers typically pass one context to
// many calls (a collective's). A goroutine per call would cost two
// scheduler hand-offs, a third of a small message's round trip.
//
// One goroutine at a time makes calls (begin, the work, end): the sender
// holding a channel, or the single Recv of a channel.
type canceller struct {
	mu       *sync.Mutex // guards every field; held while onCancel runs
	onCancel func()

	regDone  <-chan struct{} // Done of the context registered with AfterFunc
	stop     func() bool     // its stop function
	busy     <-chan struct{} // Done of the call in progress, nil between calls
	fired    bool            // onCancel ran during the call in progress
	released bool
}

// begin starts a call with ctx. It returns ctx.Err() if ctx is already
// done, and errReleased after release.
func (c *canceller) begin(ctx context.Context) error {
	done := ctx.Done()
	if done == nil {
		return nil // can never be cancelled
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return errReleased
	}
	// Checked under mu: if ctx ends after this, fire finds the call busy.
	if err := ctx.Err(); err != nil {
		return err
	}
	if done != c.regDone {
		if c.stop != nil {
			c.stop()
		}
		c.regDone = done
		c.stop = context.AfterFunc(ctx, func() { c.fire(done) })
	}
	c.busy, c.fired = done, false
	return nil
}

func (c *canceller) fire(done <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.busy == done && done != nil {
		c.fired = true
		c.onCancel()
	}
}

// endLocked ends the call and reports whether onCancel ran for it. c.mu
// must be held.
func (c *canceller) endLocked() bool {
	fired := c.fired
	c.busy, c.fired = nil, false
	return fired
}

// firedLocked reports whether the call in progress was cancelled. c.mu
// must be held.
func (c *canceller) firedLocked() bool { return c.fired }

// releaseLocked drops the AfterFunc registration for good. c.mu must be
// held.
func (c *canceller) releaseLocked() {
	c.released = true
	if c.stop != nil {
		c.stop()
		c.stop, c.regDone = nil, nil
	}
}
