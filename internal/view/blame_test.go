package view

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
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

// scripted is a transport whose liveness receives return what the test
// feeds them, per peer: nil for a heartbeat, else that error.
type scripted struct {
	recv map[transport.PeerID]chan error
}

func (s *scripted) Connect(context.Context, transport.PeerID, string) error { return nil }
func (s *scripted) Send(context.Context, transport.PeerID, transport.Channel, wire.Header, []byte) error {
	return nil
}
func (s *scripted) Close() error { return nil }
func (s *scripted) Recv(ctx context.Context, p transport.PeerID, _ transport.Channel, _ []byte) (wire.Header, int, error) {
	select {
	case err := <-s.recv[p]:
		return wire.Header{}, 0, err
	case <-ctx.Done():
		return wire.Header{}, 0, ctx.Err()
	}
}

// TestBlameSparesASurvivorThatClosed: rank 1 crashed, its heartbeat
// connection showing nothing yet (a network link to a killed process
// gets no reset), and rank 2, a survivor that saw it first, exited and
// closed its connections itself. Rank 2's close is no evidence: Blame
// names rank 1, which the collective's error names, not rank 2. A
// connection lost later than rank 2's close still names its member
// first, and the error naming rank 2 blames nobody.
func TestBlameSparesASurvivorThatClosed(t *testing.T) {
	tr := &scripted{recv: map[transport.PeerID]chan error{"b": make(chan error, 4), "c": make(chan error, 4)}}
	live, err := liveness.New(liveness.Config{Transport: tr, Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()
	live.Watch([]transport.PeerID{"b", "c"})
	tr.recv["b"] <- nil // both heard
	tr.recv["c"] <- nil
	tr.recv["c"] <- &transport.PeerError{Peer: "c", Op: "recv", Err: transport.ClosedByPeer(errors.New("Application error 0x0 (remote): closed"))}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := live.Broken("c"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("c's close never showed")
		}
	}
	if at, ok := live.Lost("c"); ok {
		t.Fatalf("c closed its connection itself, yet it is lost at %v", at)
	}
	v := &View{IDs: []transport.PeerID{"a", "b", "c"}, Rank: 0}
	toB := &transport.PeerError{Peer: "b", Op: "send", Err: errors.New("shared memory: the reader closed the stream: broken pipe")}
	if r, p, ok := v.Blame(live, time.Minute, toB); !ok || r != 1 {
		t.Errorf("Blame = rank %d (%s), %v; want rank 1 (b), not the survivor that closed", r, p, ok)
	}
	toC := &transport.PeerError{Peer: "c", Op: "send", Err: errors.New("shared memory: the reader closed the stream: broken pipe")}
	if r, p, ok := v.Blame(live, time.Minute, toC); ok {
		t.Errorf("Blame = rank %d (%s); want nobody: c closed its heartbeat connection itself", r, p)
	}

	tr.recv["b"] <- &transport.PeerError{Peer: "b", Op: "recv", Err: errors.New("shared memory: the peer's process ended without closing the stream")}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, ok := live.Lost("b"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("b's loss never showed")
		}
	}
	if r, p, ok := v.Blame(live, time.Minute, toC); !ok || r != 1 {
		t.Errorf("Blame = rank %d (%s), %v; want rank 1 (b), whose connection was lost, after c's close", r, p, ok)
	}
}

// TestBlameDecision: the pure rule, evidence to rank.
func TestBlameDecision(t *testing.T) {
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name   string
		ev     []evidence
		named  int
		closed bool
		want   int
	}{
		{"silent past the timeout wins", []evidence{{}, {silent: 3 * time.Second}, {lost: t0}}, 2, false, 1},
		{"longest silent", []evidence{{}, {silent: 3 * time.Second}, {silent: 4 * time.Second}}, 1, false, 2},
		{"first lost", []evidence{{}, {lost: t0.Add(time.Millisecond)}, {lost: t0}}, 1, false, 2},
		{"a close is no loss", []evidence{{}, {}, {left: true}}, 1, false, 1},
		{"lost beats named", []evidence{{}, {}, {lost: t0}}, 1, false, 2},
		{"named closed itself", []evidence{{}, {}, {}}, 1, true, -1},
		{"named left", []evidence{{}, {left: true}, {}}, 1, false, -1},
		{"named self", []evidence{{}, {}, {}}, 0, false, -1},
		{"none named", []evidence{{}, {}, {}}, -1, false, -1},
		{"self never", []evidence{{silent: time.Hour, lost: t0}, {}, {}}, -1, false, -1},
	} {
		if got := blame(tc.ev, 0, 2*time.Second, tc.named, tc.closed); got != tc.want {
			t.Errorf("%s: blame = %d, want %d", tc.name, got, tc.want)
		}
	}
}
