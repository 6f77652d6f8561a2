package config

import (
	"fmt"
	"strconv"
	"strings"
)

// Failpoints make a worker die at a named step of its protocols, for the
// tests of recovery: a kill from outside cannot aim at a step that lasts
// milliseconds. Config.Failpoint (GYRE_FAILPOINT) is NAME or NAME@ITER:
// the worker dies the first time it reaches step NAME at iteration ITER
// or later (default 0). A process dies as kill -9 kills it, with no word
// to its peers.
const (
	// FailVote: in Boundary, as the vote begins; its peers are in the
	// vote's allgather.
	FailVote = "vote"
	// FailSendState: the sender of a state broadcast (the root that
	// brings a joiner the state, or the winning commit's holder in a
	// recovery), after the first tensor.
	FailSendState = "send-state"
	// FailRecvState: a receiver of a state broadcast (a joiner, or a
	// member behind in a recovery), after the first tensor.
	FailRecvState = "recv-state"
	// FailPropose: a recovery's coordinator, as soon as it has sent its
	// proposal.
	FailPropose = "propose"
	// FailInstall: a member of the view a recovery decided, as it starts
	// that view: its peers have agreed on a view that holds it.
	FailInstall = "install"
	// FailProbe: as the link probes begin, those of a view's start or
	// the re-probe before iteration ITER (every 1000 iterations); its
	// peers are probing it.
	FailProbe = "probe"
	// FailCheckpoint: the writer of a checkpoint, in the middle of its
	// file, once BYTES of it are written. Spelled checkpoint@ITER:BYTES
	// (BYTES default 0); the checkpoint is the first taken at iteration
	// ITER or later.
	FailCheckpoint = "checkpoint"
)

var failpointNames = []string{FailVote, FailSendState, FailRecvState, FailPropose, FailInstall, FailProbe, FailCheckpoint}

// Failpoint is a parsed Config.Failpoint.
type Failpoint struct {
	Name  string
	Iter  int64
	Bytes int64 // FailCheckpoint: how much of the file is written
}

// ParseFailpoint parses NAME, NAME@ITER, or checkpoint@ITER:BYTES; "" is
// no failpoint.
func ParseFailpoint(s string) (Failpoint, error) {
	if s == "" {
		return Failpoint{}, nil
	}
	name, at, found := strings.Cut(s, "@")
	fp := Failpoint{Name: name}
	if found {
		at, bytes, hasBytes := strings.Cut(at, ":")
		n, err := strconv.ParseInt(at, 10, 64)
		if err != nil || n < 0 {
			return Failpoint{}, fmt.Errorf("Failpoint %q: want NAME or NAME@ITER with ITER a non-negative integer", s)
		}
		fp.Iter = n
		if hasBytes {
			b, err := strconv.ParseInt(bytes, 10, 64)
			if err != nil || b < 0 || name != FailCheckpoint {
				return Failpoint{}, fmt.Errorf("Failpoint %q: only %s takes :BYTES, a non-negative integer", s, FailCheckpoint)
			}
			fp.Bytes = b
		}
	}
	for _, known := range failpointNames {
		if name == known {
			return fp, nil
		}
	}
	return Failpoint{}, fmt.Errorf("Failpoint %q: unknown step %q; the steps are %s", s, name, strings.Join(failpointNames, ", "))
}
