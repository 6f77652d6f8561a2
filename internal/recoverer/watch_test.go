package recoverer

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// TestWatchEndsWhenAMemberLeaves: a member heard, but whose heartbeats
// say it left the watched view (it saw the view fail), ends the watch
// with ErrMemberLeft; one that left an older view does not.
func TestWatchEndsWhenAMemberLeaves(t *testing.T) {
	const interval, peerTimeout = 10 * time.Millisecond, 2 * time.Second
	net := mem.NewNetwork(1)
	var left atomic.Uint64
	left.Store(4) // an older view
	progress := map[transport.PeerID]func() liveness.Progress{
		"b": func() liveness.Progress { return liveness.Progress{Epoch: 5, Left: left.Load()} },
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	pairs := [][2]transport.PeerID{{"a", "b"}, {"b", "a"}}
	trs := map[transport.PeerID]*mem.Transport{}
	for _, p := range pairs {
		tr, err := net.Join(p[0])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs[p[0]] = tr
	}
	mons := map[transport.PeerID]*liveness.Monitor{}
	for _, p := range pairs {
		if err := trs[p[0]].Connect(ctx, p[1], string(p[1])); err != nil {
			t.Fatal(err)
		}
		m, err := liveness.New(liveness.Config{Transport: trs[p[0]], Interval: interval, Progress: progress[p[0]]})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		m.Watch([]transport.PeerID{p[1]})
		mons[p[0]] = m
	}

	wctx, stop := Watch(ctx, mons["a"], peerTimeout, 5, []transport.PeerID{"a", "b"}, 0)
	defer stop()
	select {
	case <-wctx.Done():
		t.Fatalf("the watch ended while b was in the view: %v", context.Cause(wctx))
	case <-time.After(30 * interval):
	}
	left.Store(5)
	select {
	case <-wctx.Done():
		if cause := context.Cause(wctx); !errors.Is(cause, ErrMemberLeft) {
			t.Fatalf("the watch ended with %v; want ErrMemberLeft", cause)
		}
	case <-time.After(peerTimeout / 2):
		t.Fatal("b left the view, and the watch goes on")
	}
}
