package gyre_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
)

// TestStalledWorkerSaysSo: a worker that was itself stopped longer than
// PeerTimeout says so first, whether its peers' failures reach it as a
// lost peer or, when the vote still completed, as a failed iteration;
// the errors still match what a trainer tests for.
func TestStalledWorkerSaysSo(t *testing.T) {
	cause := errors.New("send to rank 0: closed")
	for _, tc := range []struct {
		err  error
		is   error
		want string
	}{
		{&gyre.PeerLostError{Iter: 7, Rank: 0, Peer: "w-a", Err: cause, Unresponsive: 5 * time.Second, SelfRank: 1, Self: "w-b", PeerTimeout: 2 * time.Second},
			gyre.ErrPeerLost, "gyre: rank 1 (w-b, this worker) was unresponsive for 5s in iteration 7, longer than PeerTimeout 2s"},
		{&gyre.IterationError{Iter: 7, Ranks: []int{0, 1}, Reasons: []string{"peer gone", "other"}, Local: cause,
			Unresponsive: 5 * time.Second, SelfRank: 1, Self: "w-b", PeerTimeout: 2 * time.Second},
			gyre.ErrIterationFailed, "gyre: rank 1 (w-b, this worker) was unresponsive for 5s in iteration 7, longer than PeerTimeout 2s " +
				"(stopped, as by SIGSTOP, or starved of CPU); the iteration failed on rank 0 (peer gone), rank 1 (other): send to rank 0: closed"},
		{&gyre.IterationError{Iter: 7, Ranks: []int{0}, Reasons: []string{"peer gone"}},
			gyre.ErrIterationFailed, "gyre: iteration 7 failed on rank 0 (peer gone)"},
	} {
		if msg := tc.err.Error(); !strings.HasPrefix(msg, tc.want) {
			t.Errorf("%T says %q, want it to start %q", tc.err, msg, tc.want)
		}
		if !errors.Is(tc.err, tc.is) {
			t.Errorf("%T does not match %v", tc.err, tc.is)
		}
	}
}
