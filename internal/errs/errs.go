// Package errs holds the sentinel errors that the engine and its
// components return and package gyre exports under the same names, so
// that errors.Is matches across the layers. It is a leaf: it imports
// nothing of the module.
package errs

import "errors"

// The sentinels; package gyre documents each.
var (
	Diverged        = errors.New("gyre: workers diverged")
	Pending         = errors.New("gyre: gradients pending: call Wait first")
	Closed          = errors.New("gyre: worker closed")
	NoQuorum        = errors.New("gyre: no quorum")
	IterationFailed = errors.New("gyre: iteration failed")
	Checkpoint      = errors.New("gyre: checkpoint failed")
)
