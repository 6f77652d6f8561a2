package gyre

import (
	"slices"
	"testing"

	"github.com/gyre-ml/gyre/liveness"
)

// TestNotArrived checks the stall report's decision: a peer in an earlier
// epoch, or with fewer collectives begun in this one, has not arrived; one
// level with this worker or ahead has; one with no fresh heartbeat is
// unknown, whatever it last said.
func TestNotArrived(t *testing.T) {
	mine := liveness.Progress{Epoch: 4, Iter: 10, Begun: 21}
	peers := []peerProgress{
		{rank: 0, at: liveness.Progress{Epoch: 4, Iter: 10, Begun: 21}, known: true}, // in it too
		{rank: 1, at: liveness.Progress{Epoch: 4, Iter: 10, Begun: 20}, known: true}, // one short
		{rank: 3, at: liveness.Progress{Epoch: 3, Iter: 12, Begun: 90}, known: true}, // an older view
		{rank: 4, at: liveness.Progress{Epoch: 5, Iter: 9, Begun: 1}, known: true},   // a newer view
		{rank: 5, at: liveness.Progress{Epoch: 4, Iter: 9, Begun: 2}, known: false},  // stale
		{rank: 6, known: false}, // never heard
	}
	behind, unknown := notArrived(mine, peers)
	if !slices.Equal(behind, []int{1, 3}) || !slices.Equal(unknown, []int{5, 6}) {
		t.Errorf("behind %v, unknown %v; want [1 3] and [5 6]", behind, unknown)
	}
	if behind, unknown := notArrived(mine, peers[:1]); behind != nil || unknown != nil {
		t.Errorf("every peer arrived: behind %v, unknown %v", behind, unknown)
	}
}
