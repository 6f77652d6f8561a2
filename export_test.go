package gyre

import (
	"time"

	"github.com/gyre-ml/gyre/internal/gossip"
	"github.com/gyre-ml/gyre/ring"
)

// Hooks into a Worker's internals for the external tests (package
// gyre_test), which use the gyretest harness and so cannot be in-package.

// WithFailAction makes a worker that reaches its Config.Failpoint call
// die instead of killing its process: an in-process test kills the
// worker there and ends its goroutine.
func WithFailAction(die func()) Option { return func(o *options) { o.Test.FailAction = die } }

// WithTimelineSkew adds skew to every timestamp of the worker's timeline,
// as if its clock were off by that much.
func WithTimelineSkew(skew time.Duration) Option {
	return func(o *options) { o.Test.TimelineSkew = skew }
}

// DataComm returns the data communicator of w's current view, for tests
// that run collectives on it directly.
func DataComm(w *Worker) *ring.Comm { return w.e.DataComm() }

// FailIteration records err as the iteration's failed collective, as Wait
// does for a failed bucket.
func FailIteration(w *Worker, err error) { w.e.FailIteration(err) }

// WithReprobeEvery sets how often the worker's views probe their links
// again, in iterations.
func WithReprobeEvery(n int64) Option { return func(o *options) { o.Test.ReprobeEvery = n } }

// WithHandshakeNote sets how often the worker logs a stuck admission
// handshake.
func WithHandshakeNote(d time.Duration) Option { return func(o *options) { o.Test.HandshakeNote = d } }

// WaitCheckpoint waits until w writes no checkpoint, for tests that need
// each checkpoint on disk before the next iteration.
func WaitCheckpoint(w *Worker) { w.e.WaitCheckpoint() }

// SetStarterPatience sets how long the first seed waits for seeds that
// do not answer, and returns a function that restores it.
func SetStarterPatience(d time.Duration) (restore func()) { return gossip.SetStarterPatience(d) }
