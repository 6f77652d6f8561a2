package obs

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
	peers := []PeerProgress{
		{Rank: 0, At: liveness.Progress{Epoch: 4, Iter: 10, Begun: 21}, Known: true}, // in it too
		{Rank: 1, At: liveness.Progress{Epoch: 4, Iter: 10, Begun: 20}, Known: true}, // one short
		{Rank: 3, At: liveness.Progress{Epoch: 3, Iter: 12, Begun: 90}, Known: true}, // an older view
		{Rank: 4, At: liveness.Progress{Epoch: 5, Iter: 9, Begun: 1}, Known: true},   // a newer view
		{Rank: 5, At: liveness.Progress{Epoch: 4, Iter: 9, Begun: 2}, Known: false},  // stale
		{Rank: 6, Known: false}, // never heard
	}
	behind, unknown := NotArrived(mine, peers)
	if !slices.Equal(behind, []int{1, 3}) || !slices.Equal(unknown, []int{5, 6}) {
		t.Errorf("behind %v, unknown %v; want [1 3] and [5 6]", behind, unknown)
	}
	if behind, unknown := NotArrived(mine, peers[:1]); behind != nil || unknown != nil {
		t.Errorf("every peer arrived: behind %v, unknown %v", behind, unknown)
	}
}
