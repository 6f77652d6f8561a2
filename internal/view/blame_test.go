package view

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// TestBlameSparesAPeerThatClosed: with no heartbeat evidence, Blame names
// the peer a collective's error names, unless that peer closed the link
// itself (alive, it left the collective): then it names nobody.
func TestBlameSparesAPeerThatClosed(t *testing.T) {
	net := mem.NewNetwork(1)
	a, err := net.Join("a")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := net.Join("b")
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := a.Connect(ctx, "b", "b"); err != nil {
		t.Fatal(err)
	}
	live, err := liveness.New(liveness.Config{Transport: a, Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	live.Watch([]transport.PeerID{"b"}) // heard from now; b sends no heartbeats, but is not silent yet
	v := &View{IDs: []transport.PeerID{"a", "b"}, Rank: 0}

	closed := &transport.PeerError{Peer: "b", Op: "recv", Err: transport.ClosedByPeer(errors.New("stream canceled by remote"))}
	if r, p, ok := v.Blame(live, time.Minute, closed); ok {
		t.Errorf("a peer that closed its side itself is blamed: rank %d (%s)", r, p)
	}
	broken := &transport.PeerError{Peer: "b", Op: "recv", Err: errors.New("connection reset")}
	if r, p, ok := v.Blame(live, time.Minute, broken); !ok || r != 1 || p != "b" {
		t.Errorf("a broken link blames rank %d (%s), %v; want rank 1 (b)", r, p, ok)
	}

	// b's heartbeats say it left the view of epoch 5: not blamed in that
	// view, whatever its links did; blamed in a later one.
	if err := b.Connect(ctx, "a", "a"); err != nil {
		t.Fatal(err)
	}
	mb, err := liveness.New(liveness.Config{Transport: b, Interval: 10 * time.Millisecond,
		Progress: func() liveness.Progress { return liveness.Progress{Epoch: 5, Left: 5} }})
	if err != nil {
		t.Fatal(err)
	}
	defer mb.Close()
	mb.Watch([]transport.PeerID{"a"})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if pr, _, ok := live.Progress("b"); ok && pr.Left == 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no heartbeat from b")
		}
	}
	v.Epoch = 5
	if r, p, ok := v.Blame(live, time.Minute, broken); ok {
		t.Errorf("a peer that left the view is blamed: rank %d (%s)", r, p)
	}
	v.Epoch = 6
	if r, _, ok := v.Blame(live, time.Minute, broken); !ok || r != 1 {
		t.Errorf("in a later view, a broken link to a peer that left an earlier one blames rank %d, %v; want rank 1", r, ok)
	}
}
