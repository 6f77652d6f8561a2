package engine

import "github.com/gyre-ml/gyre/ring"

// Seams for package gyre's tests (its export_test.go): nothing else calls
// them.

// DataComm returns the current view's data communicator, for tests that
// run collectives on it directly.
func (e *Engine) DataComm() *ring.Comm { return e.cur.Data }

// FailIteration records err as the iteration's failed collective, as Wait
// does for a failed bucket.
func (e *Engine) FailIteration(err error) {
	if e.it.failed == nil {
		e.it.failed = err
	}
}

// WaitCheckpoint waits until the worker writes no checkpoint.
func (e *Engine) WaitCheckpoint() { e.ckpt.taker.Wait() }
