package ring

import (
	"errors"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/transport"
)

// TestPeerLostErrorNamesNoLiveRank: a collective ended by a peer that
// closed its side itself (alive, as one leaving to recover) says so; one
// ended by a broken link says the link failed. Neither calls the peer
// lost (a live peer's close looks like a crash over TCP). Both match
// ErrPeerLost, so that the caller recovers either way.
func TestPeerLostErrorNamesNoLiveRank(t *testing.T) {
	closed := &PeerLostError{Rank: 3, Peer: "d", Err: &transport.PeerError{Peer: "d", Op: "recv",
		Err: transport.ClosedByPeer(errors.New("stream 10 canceled by remote with error code 0"))}}
	broken := &PeerLostError{Rank: 3, Peer: "d", Err: &transport.PeerError{Peer: "d", Op: "recv",
		Err: errors.New("received a stateless reset")}}
	if msg := closed.Error(); strings.Contains(msg, "lost rank") || !strings.Contains(msg, "rank 3 (d) closed its side") {
		t.Errorf("a live peer's close reads %q", msg)
	}
	if msg := broken.Error(); strings.Contains(msg, "lost rank") || !strings.Contains(msg, "the link to rank 3 (d) failed") {
		t.Errorf("a broken link reads %q", msg)
	}
	for _, err := range []error{closed, broken} {
		if !errors.Is(err, ErrPeerLost) || !errors.Is(err, transport.ErrPeerGone) {
			t.Errorf("%v does not match ErrPeerLost and transport.ErrPeerGone", err)
		}
	}
}
