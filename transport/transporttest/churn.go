package transporttest

import (
	"context"
	"errors"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/transport"
)

// churnCycles is how many drop-and-reconnect cycles testDropReconnect
// runs. A goroutine left behind per cycle shows after two; the leak this
// case was written for left 2 per side and stripe.
const churnCycles = 6

// exchange connects a and b both ways and sends one message each way,
// large enough to use every stripe, checking that it arrives.
func exchange(t *testing.T, ctx context.Context, a, b Node, seq int) {
	t.Helper()
	connect(t, ctx, a, b)
	connect(t, ctx, b, a)
	const n = 1 << 20 // at least wire.StripeMin per stripe for up to 4 stripes
	for _, dir := range [][2]Node{{a, b}, {b, a}} {
		from, to := dir[0], dir[1]
		p := make([]byte, n)
		FillPattern(p, uint64(seq))
		sent := async(func() error { return from.T.Send(ctx, to.ID, transport.ChanData, testHeader(seq), p) })
		// After a drop, Recv keeps reporting it until the peer's new
		// streams arrive.
		err := recvCheck(ctx, to, from.ID, transport.ChanData, make([]byte, n), testHeader(seq), n, uint64(seq))
		for retry := time.Now().Add(5 * time.Second); errors.Is(err, transport.ErrPeerGone) && seq > 0 && time.Now().Before(retry); {
			time.Sleep(5 * time.Millisecond)
			err = recvCheck(ctx, to, from.ID, transport.ChanData, make([]byte, n), testHeader(seq), n, uint64(seq))
		}
		if err != nil {
			t.Fatalf("cycle %d: %v", seq, err)
		}
		wait(t, ctx, "send", sent)
	}
}

// steadyGoroutines returns the goroutine count once it has held still for
// three samples in a row (at most 2 s).
func steadyGoroutines() int {
	last, same := runtime.NumGoroutine(), 0
	for deadline := time.Now().Add(2 * time.Second); same < 3 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		n := runtime.NumGoroutine()
		if n == last {
			same++
		} else {
			last, same = n, 0
		}
	}
	return last
}

// goroutinesBack polls until at most want goroutines run, for up to 10 s
// (a transport may close a dropped connection's streams asynchronously),
// and returns the last count.
func goroutinesBack(want int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := runtime.NumGoroutine()
		if got <= want || time.Now().After(deadline) {
			return got
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// testDropReconnect drops and reconnects a pair of peers churnCycles
// times, exchanging striped messages each time, and checks that the
// goroutine count ends where it was after the first cycle: a dropped peer
// leaves no stripe writer or reader behind.
func testDropReconnect(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	da, okA := a.T.(transport.Dropper)
	db, okB := b.T.(transport.Dropper)
	if !okA || !okB {
		t.Skip("the transport does not implement transport.Dropper")
	}
	drop := func() {
		da.Drop(b.ID, errors.New("churn"))
		db.Drop(a.ID, errors.New("churn"))
	}
	exchange(t, ctx, a, b, 0)
	drop()
	base := steadyGoroutines()
	for i := 1; i <= churnCycles; i++ {
		exchange(t, ctx, a, b, i)
		drop()
	}
	if got := goroutinesBack(base); got > base {
		t.Fatalf("%d goroutines after %d drop-and-reconnect cycles, %d after the first", got, churnCycles, base)
	}
	checkLinkStats(t, ctx, a, churnCycles+1)
}

// checkLinkStats checks a's link counters, if it keeps them, after
// cycles connects to one peer, each ended by a Drop, then
// dials an address nobody answers at and checks that it counts.
func checkLinkStats(t *testing.T, ctx context.Context, a Node, cycles int) {
	lc, ok := a.T.(transport.LinkCounter)
	if !ok {
		return
	}
	got := lc.LinkStats()
	// A Drop is the caller's decision, not a link failure; whether the
	// peer's own drop breaks a stream of a's first is a race, so link
	// failures are not checked here.
	if got.Connects != uint64(cycles) || got.Reconnects != uint64(cycles-1) || got.DialErrors != 0 {
		t.Errorf("after %d connects each dropped: %+v, want %d connects, %d reconnects, no dial errors", cycles, got, cycles, cycles-1)
	}
	dead := deadAddr(t)
	dctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := a.T.Connect(dctx, "nobody", dead); err == nil {
		t.Fatalf("Connect to %s, where nobody listens, succeeded", dead)
	}
	if after := lc.LinkStats(); after.DialErrors != 1 || after.Connects != got.Connects {
		t.Errorf("after a failed dial: %+v, want 1 dial error and no new connect", after)
	}
}

// deadAddr returns a loopback address where nothing listens, on TCP or UDP.
func deadAddr(t *testing.T) string {
	l, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.LocalAddr().String()
	l.Close()
	return addr
}

// testForget forgets a peer with a Recv pending from it, then connects and
// exchanges again, and checks that forgetting both sides returns the
// goroutine count to where it was before they first met.
func testForget(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	fa, okA := a.T.(transport.Forgetter)
	fb, okB := b.T.(transport.Forgetter)
	if !okA || !okB {
		t.Skip("the transport does not implement transport.Forgetter")
	}
	before := steadyGoroutines()
	exchange(t, ctx, a, b, 1)
	pending := asyncRecv(ctx, a, b.ID, transport.ChanData, make([]byte, 8))
	time.Sleep(settle)
	fa.Forget(b.ID)
	if r := await(t, ctx, "recv pending at Forget", pending); !errors.Is(r.err, transport.ErrPeerGone) {
		t.Fatalf("recv pending at Forget: got %v, want a PeerError", r.err)
	}
	if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(2), nil); !errors.Is(err, transport.ErrNotConnected) {
		t.Fatalf("send to a forgotten peer: got %v, want ErrNotConnected", err)
	}
	fb.Forget(a.ID)
	exchange(t, ctx, a, b, 0) // met again as strangers: no drop to report
	fa.Forget(b.ID)
	fb.Forget(a.ID)
	if got := goroutinesBack(before); got > before {
		t.Fatalf("%d goroutines after forgetting each other, %d before they met", got, before)
	}
}
