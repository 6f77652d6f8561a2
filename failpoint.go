package gyre

import "github.com/gyre-ml/gyre/internal/config"

// Failpoints make a worker die at a named step of its protocols, for the
// tests of recovery: a kill from outside cannot aim at a step that lasts
// milliseconds. Config.Failpoint (GYRE_FAILPOINT) is NAME or NAME@ITER:
// the worker dies the first time it reaches step NAME at iteration ITER
// or later (default 0). A process dies as kill -9 kills it, with no word
// to its peers.
const (
	// FailVote: in Boundary, as the vote begins; its peers are in the
	// vote's allgather.
	FailVote = config.FailVote
	// FailSendState: the sender of a state broadcast (the root that
	// brings a joiner the state, or the winning commit's holder in a
	// recovery), after the first tensor.
	FailSendState = config.FailSendState
	// FailRecvState: a receiver of a state broadcast (a joiner, or a
	// member behind in a recovery), after the first tensor.
	FailRecvState = config.FailRecvState
	// FailPropose: a recovery's coordinator, as soon as it has sent its
	// proposal.
	FailPropose = config.FailPropose
	// FailInstall: a member of the view a recovery decided, as it starts
	// that view: its peers have agreed on a view that holds it.
	FailInstall = config.FailInstall
	// FailProbe: at a boundary that measures the links again, as the
	// probes begin; its peers are probing it.
	FailProbe = config.FailProbe
	// FailCheckpoint: the writer of a checkpoint, in the middle of its
	// file, once BYTES of it are written. Spelled checkpoint@ITER:BYTES
	// (BYTES default 0); the checkpoint is the first taken at iteration
	// ITER or later.
	FailCheckpoint = config.FailCheckpoint
)
