package mem_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// join adds n nodes named n0, n1, … to net.
func join(tb testing.TB, net *mem.Network, n int) []transporttest.Node {
	tb.Helper()
	nodes := make([]transporttest.Node, n)
	for i := range nodes {
		nodes[i] = joinID(tb, net, transport.PeerID(fmt.Sprintf("n%d", i)))
	}
	return nodes
}

func newNodes(tb testing.TB, n int) []transporttest.Node {
	return join(tb, mem.NewNetwork(1), n)
}

// connected returns n connected nodes on net, and a context for the test.
func connected(t *testing.T, net *mem.Network, n int) ([]transporttest.Node, context.Context) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	nodes := join(t, net, n)
	transporttest.ConnectAll(t, ctx, nodes)
	return nodes, ctx
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, newNodes)
}

func hdr(seq int) wire.Header {
	return wire.Header{Kind: wire.KindData, DType: wire.DTypeBytes, Seq: uint64(seq)}
}

func send(t *testing.T, ctx context.Context, from, to transporttest.Node, seq int) {
	t.Helper()
	if err := from.T.Send(ctx, to.ID, transport.ChanData, hdr(seq), []byte{byte(seq)}); err != nil {
		t.Fatalf("%s send %d to %s: %v", from.ID, seq, to.ID, err)
	}
}

// recvSeq receives one message and returns its Seq, or the error.
func recvSeq(ctx context.Context, node transporttest.Node, from transport.PeerID) (int, error) {
	var buf [8]byte
	h, _, err := node.T.Recv(ctx, from, transport.ChanData, buf[:])
	return int(h.Seq), err
}

func expectSeq(t *testing.T, ctx context.Context, node transporttest.Node, from transport.PeerID, want int) {
	t.Helper()
	got, err := recvSeq(ctx, node, from)
	if err != nil || got != want {
		t.Fatalf("%s recv from %s: got %d, %v; want %d", node.ID, from, got, err, want)
	}
}

// expectLost checks that nothing arrives from from before a short deadline.
func expectLost(t *testing.T, ctx context.Context, node transporttest.Node, from transport.PeerID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if got, err := recvSeq(ctx, node, from); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s recv from %s: got %d, %v; want the deadline (message lost)", node.ID, from, got, err)
	}
}

func TestDropAll(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 2)
	a, b := nodes[0], nodes[1]
	net.SetLink(a.ID, b.ID, mem.Link{Drop: 1})
	send(t, ctx, a, b, 1)
	expectLost(t, ctx, b, a.ID)
	// Links are one-way: the other direction still works.
	send(t, ctx, b, a, 2)
	expectSeq(t, ctx, a, b.ID, 2)
	// Clearing the link restores delivery; the lost message stays lost.
	net.SetLink(a.ID, b.ID, mem.Link{})
	send(t, ctx, a, b, 3)
	expectSeq(t, ctx, b, a.ID, 3)
}

func TestPartitionHeal(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 4)
	a, b, c, d := nodes[0], nodes[1], nodes[2], nodes[3]
	// d is in no group, so it sits in a group of its own with other unnamed peers.
	net.Partition([]transport.PeerID{a.ID}, []transport.PeerID{b.ID, c.ID})
	send(t, ctx, a, b, 1)
	send(t, ctx, b, a, 2)
	send(t, ctx, d, c, 3)
	send(t, ctx, b, c, 4)
	expectLost(t, ctx, b, a.ID)
	expectLost(t, ctx, a, b.ID)
	expectLost(t, ctx, c, d.ID)
	expectSeq(t, ctx, c, b.ID, 4)

	net.Heal()
	send(t, ctx, a, b, 5)
	send(t, ctx, b, a, 6)
	send(t, ctx, d, c, 7)
	expectSeq(t, ctx, b, a.ID, 5)
	expectSeq(t, ctx, a, b.ID, 6)
	expectSeq(t, ctx, c, d.ID, 7)
}

func TestKill(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 4)
	victim := nodes[0]
	// loner never connected to the victim but waits for it all the same;
	// bystander has nothing to do with it until after the kill.
	loner := joinID(t, net, "loner")
	bystander := joinID(t, net, "bystander")

	// A message queued before the crash is lost with it.
	send(t, ctx, victim, nodes[1], 1)

	type result struct {
		who transport.PeerID
		err error
	}
	waiters := []struct {
		node transporttest.Node
		ch   transport.Channel
	}{
		{nodes[1], transport.ChanControl},
		{nodes[2], transport.ChanData},
		{nodes[3], transport.ChanProbe},
		{loner, transport.ChanData},
	}
	results := make(chan result, len(waiters))
	for _, w := range waiters {
		go func() {
			_, _, err := w.node.T.Recv(ctx, victim.ID, w.ch, nil)
			results <- result{w.node.ID, err}
		}()
	}
	victimRecv := make(chan error, 1)
	go func() {
		_, _, err := victim.T.Recv(ctx, nodes[1].ID, transport.ChanData, nil)
		victimRecv <- err
	}()
	time.Sleep(20 * time.Millisecond)

	start := time.Now()
	net.Kill(victim.ID)
	for range waiters {
		r := <-results
		if peer, ok := transport.PeerOf(r.err); !ok || peer != victim.ID || !errors.Is(r.err, mem.ErrKilled) {
			t.Errorf("%s recv pending at kill: got %v, want a PeerError for %s wrapping ErrKilled", r.who, r.err, victim.ID)
		}
	}
	if d := time.Since(start); d > 200*time.Millisecond {
		t.Errorf("pending calls failed %v after the kill, want at once", d)
	}
	if err := <-victimRecv; !errors.Is(err, transport.ErrClosed) {
		t.Errorf("victim's own pending recv: got %v, want ErrClosed", err)
	}

	// Later calls fail at once too, and the queued message is gone.
	for _, n := range nodes[1:] {
		if got, err := recvSeq(ctx, n, victim.ID); !errors.Is(err, mem.ErrKilled) {
			t.Errorf("%s recv after kill: got %d, %v; want a PeerError wrapping ErrKilled", n.ID, got, err)
		}
		err := n.T.Send(ctx, victim.ID, transport.ChanData, hdr(1), nil)
		if peer, _ := transport.PeerOf(err); peer != victim.ID || !errors.Is(err, mem.ErrKilled) {
			t.Errorf("%s send after kill: got %v, want a PeerError for %s wrapping ErrKilled", n.ID, err, victim.ID)
		}
	}
	if err := victim.T.Send(ctx, nodes[1].ID, transport.ChanData, hdr(1), nil); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("victim send after kill: got %v, want ErrClosed", err)
	}
	// Even a node that never dealt with the victim is told at once.
	if _, err := recvSeq(ctx, bystander, victim.ID); !errors.Is(err, mem.ErrKilled) {
		t.Errorf("bystander recv after kill: got %v, want a PeerError wrapping ErrKilled", err)
	}
	// The survivors still talk to each other.
	send(t, ctx, nodes[1], nodes[2], 9)
	expectSeq(t, ctx, nodes[2], nodes[1].ID, 9)
}

// TestRejoin restarts a killed node under its old id.
func TestRejoin(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 2)
	a, b := nodes[0], nodes[1]
	if _, err := net.Join(a.ID); err == nil {
		t.Fatal("joining under a live id succeeded")
	}
	net.Kill(a.ID)
	a2 := joinID(t, net, a.ID)
	if _, err := recvSeq(ctx, b, a.ID); !errors.Is(err, mem.ErrKilled) {
		t.Fatalf("recv from the killed incarnation: %v", err)
	}
	transporttest.ConnectAll(t, ctx, []transporttest.Node{a2, b})
	send(t, ctx, a2, b, 1)
	send(t, ctx, b, a2, 2)
	expectSeq(t, ctx, b, a.ID, 1)
	expectSeq(t, ctx, a2, b.ID, 2)
}

func TestConnectErrors(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes := join(t, net, 2)
	a, b := nodes[0], nodes[1]
	ctx := t.Context()
	if err := a.T.Connect(ctx, "ghost", "ghost"); !errors.Is(err, mem.ErrNoNode) || !errors.Is(err, transport.ErrPeerGone) {
		t.Errorf("connect to an absent node: got %v, want a PeerError wrapping ErrNoNode", err)
	}
	if err := a.T.Connect(ctx, "ghost", b.Addr); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Errorf("connect to the wrong node: got %v, want ErrUnauthenticated", err)
	}
	if err := a.T.Connect(ctx, a.ID, a.Addr); err == nil {
		t.Error("connect to itself succeeded")
	}
	if _, err := net.Join(""); err == nil {
		t.Error("join with an empty id succeeded")
	}
}

// TestSendNeedsConnect checks that a session opened by the peer lets this
// side receive but not send: Send needs this side's own Connect.
func TestSendNeedsConnect(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes := join(t, net, 2)
	a, b := nodes[0], nodes[1]
	ctx := t.Context()
	if err := a.T.Connect(ctx, b.ID, b.Addr); err != nil {
		t.Fatal(err)
	}
	if err := b.T.Send(ctx, a.ID, transport.ChanData, hdr(1), nil); !errors.Is(err, transport.ErrNotConnected) {
		t.Fatalf("send back without connecting: got %v, want ErrNotConnected", err)
	}
	if err := b.T.Connect(ctx, a.ID, a.Addr); err != nil {
		t.Fatal(err)
	}
	send(t, ctx, b, a, 2)
	expectSeq(t, ctx, a, b.ID, 2)
}

// TestBadHeader checks that Send refuses a header a real receiver would
// reject, and that the session survives it.
func TestBadHeader(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 2)
	a, b := nodes[0], nodes[1]
	for _, h := range []wire.Header{{}, {Kind: wire.KindData, DType: 200}, {Kind: wire.KindData, Op: 200}} {
		if err := a.T.Send(ctx, b.ID, transport.ChanData, h, nil); !errors.Is(err, wire.ErrMalformed) {
			t.Errorf("send with header %+v: got %v, want ErrMalformed", h, err)
		}
	}
	send(t, ctx, a, b, 1)
	expectSeq(t, ctx, b, a.ID, 1)
}

// TestCloseDelivers checks that a graceful Close, unlike Kill, lets peers
// read what was sent before it.
func TestCloseDelivers(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 2)
	a, b := nodes[0], nodes[1]
	send(t, ctx, a, b, 1)
	send(t, ctx, a, b, 2)
	a.T.Close()
	expectSeq(t, ctx, b, a.ID, 1)
	expectSeq(t, ctx, b, a.ID, 2)
	if _, err := recvSeq(ctx, b, a.ID); !errors.Is(err, mem.ErrPeerClosed) {
		t.Fatalf("recv after the queue drained: got %v, want a PeerError wrapping ErrPeerClosed", err)
	}
	if err := b.T.Send(ctx, a.ID, transport.ChanData, hdr(3), nil); !errors.Is(err, mem.ErrPeerClosed) {
		t.Fatalf("send to the closed peer: got %v, want a PeerError wrapping ErrPeerClosed", err)
	}
}

func TestDrop(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 2)
	a, b := nodes[0], nodes[1]
	send(t, ctx, a, b, 1) // queued, to be discarded by the drop
	pending := make(chan error, 1)
	go func() {
		_, err := recvSeq(ctx, a, b.ID)
		pending <- err
	}()
	time.Sleep(20 * time.Millisecond)

	reason := errors.New("too slow")
	b.T.(transport.Dropper).Drop(a.ID, reason)
	if err := <-pending; !errors.Is(err, mem.ErrDropped) {
		t.Errorf("dropped side's pending recv: got %v, want a PeerError wrapping ErrDropped", err)
	}
	if _, err := recvSeq(ctx, b, a.ID); !errors.Is(err, reason) {
		t.Errorf("recv from the dropped peer: got %v, want the drop reason", err)
	}
	if peer, _ := transport.PeerOf(a.T.Send(ctx, b.ID, transport.ChanData, hdr(2), nil)); peer != b.ID {
		t.Errorf("send to the dropping peer: PeerOf = %q, want %q", peer, b.ID)
	}

	// A new Connect opens a fresh session.
	transporttest.ConnectAll(t, ctx, nodes)
	send(t, ctx, a, b, 3)
	expectSeq(t, ctx, b, a.ID, 3)
}

// TestDelayKeepsOrder runs in a synctest bubble, so the delays cost no real
// time and the timing checks are exact.
func TestDelayKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := mem.NewNetwork(7)
		nodes, ctx := connected(t, net, 2)
		a, b := nodes[0], nodes[1]
		const delay, jitter = 20 * time.Millisecond, 30 * time.Millisecond
		net.SetLink(a.ID, b.ID, mem.Link{Delay: delay, Jitter: jitter})
		const count = 50
		var sent, arrived [count]time.Time
		received := make(chan error, 1)
		go func() {
			for i := range count {
				seq, err := recvSeq(ctx, b, a.ID)
				if err == nil && seq != i {
					err = fmt.Errorf("got message %d, want %d", seq, i)
				}
				if err != nil {
					received <- err
					return
				}
				arrived[i] = time.Now()
			}
			received <- nil
		}()
		for i := range count {
			sent[i] = time.Now()
			send(t, ctx, a, b, i)
			time.Sleep(time.Millisecond)
		}
		if err := <-received; err != nil {
			t.Fatal(err)
		}
		// No message arrives before its delay, and none waits longer than
		// delay+jitter after it was sent: an earlier message, sent sooner,
		// was due sooner still.
		for i := range count {
			if d := arrived[i].Sub(sent[i]); d < delay || d >= delay+jitter {
				t.Errorf("message %d took %v, want in [%v, %v)", i, d, delay, delay+jitter)
			}
		}
	})
}

// dropPattern sends count messages over two lossy streams at once, and
// returns the sequence numbers that got through on each.
func dropPattern(t *testing.T, seed int64) [2][]int {
	t.Helper()
	net := mem.NewNetwork(seed)
	nodes, ctx := connected(t, net, 3)
	dst := nodes[2]
	const count = 200
	var got [2][]int
	done := make(chan error, 2)
	for _, src := range nodes[:2] {
		net.SetLink(src.ID, dst.ID, mem.Link{Drop: 0.5})
		go func() {
			for seq := range count {
				if err := src.T.Send(ctx, dst.ID, transport.ChanData, hdr(seq), nil); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// A marker sent over a clean link ends each stream.
	for i, src := range nodes[:2] {
		net.SetLink(src.ID, dst.ID, mem.Link{})
		send(t, ctx, src, dst, count)
		for {
			seq, err := recvSeq(ctx, dst, src.ID)
			if err != nil {
				t.Fatal(err)
			}
			if seq == count {
				break
			}
			got[i] = append(got[i], seq)
		}
	}
	return got
}

// TestRateSerializes: on a link of 10 MB/s, four 1 MB messages sent at
// once arrive 100 ms apart, and a small one sent after them waits its
// turn; the other direction, with no rate, is not held back.
func TestRateSerializes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		net := mem.NewNetwork(7)
		nodes, ctx := connected(t, net, 2)
		a, b := nodes[0], nodes[1]
		net.SetLink(a.ID, b.ID, mem.Link{Rate: 10e6})
		start := time.Now()
		big := make([]byte, 1e6)
		for i := range 4 {
			if err := a.T.Send(ctx, b.ID, transport.ChanData, hdr(i), big); err != nil {
				t.Fatal(err)
			}
		}
		send(t, ctx, a, b, 4)
		send(t, ctx, b, a, 0)
		expectSeq(t, ctx, a, b.ID, 0)
		if d := time.Since(start); d != 0 {
			t.Errorf("the unlimited direction took %v", d)
		}
		buf := make([]byte, len(big))
		for i := range 5 {
			h, _, err := b.T.Recv(ctx, a.ID, transport.ChanData, buf)
			if err != nil || h.Seq != uint64(i) {
				t.Fatalf("message %d: %+v, %v", i, h, err)
			}
			// The small one takes its own few bytes' worth after the four.
			want := time.Duration(min(i+1, 4)) * 100 * time.Millisecond
			if d := time.Since(start); d < want || d > want+time.Microsecond {
				t.Errorf("message %d arrived after %v, want %v", i, d, want)
			}
		}
	})
}

func TestSeedReplays(t *testing.T) {
	first := dropPattern(t, 42)
	for i, p := range first {
		if len(p) < 60 || len(p) > 140 {
			t.Errorf("stream %d: %d of 200 messages got through at Drop 0.5", i, len(p))
		}
		if !slices.IsSorted(p) {
			t.Errorf("stream %d out of order: %v", i, p)
		}
	}
	if slices.Equal(first[0], first[1]) {
		t.Error("two streams share one drop pattern")
	}
	if again := dropPattern(t, 42); !slices.Equal(first[0], again[0]) || !slices.Equal(first[1], again[1]) {
		t.Errorf("same seed, different drops:\n%v\n%v", first, again)
	}
	if other := dropPattern(t, 43); slices.Equal(first[0], other[0]) {
		t.Error("another seed gave the same drops")
	}
}

// TestZeroAllocs checks that steady-state Send and Recv allocate nothing,
// which the ring's zero-allocation goal depends on.
func TestZeroAllocs(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 2)
	a, b := nodes[0], nodes[1]
	for _, size := range []int{0, 100, 4 << 10, 1 << 20} {
		payload := make([]byte, size)
		buf := make([]byte, size)
		h := hdr(1)
		var err error
		allocs := testing.AllocsPerRun(100, func() {
			if err = a.T.Send(ctx, b.ID, transport.ChanData, h, payload); err != nil {
				return
			}
			_, _, err = b.T.Recv(ctx, a.ID, transport.ChanData, buf)
		})
		if err != nil {
			t.Fatal(err)
		}
		if allocs != 0 {
			t.Errorf("%d-byte message: %v allocations per Send+Recv, want 0", size, allocs)
		}
	}
}

// TestRing64 runs a 64-rank ring exchange, the largest in-process world the
// ring tests use: every rank sends to its right neighbour before receiving
// from its left one.
func TestRing64(t *testing.T) {
	const ranks, rounds, size = 64, 20, 4 << 10
	net := mem.NewNetwork(1)
	nodes := join(t, net, ranks)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	for r, n := range nodes {
		right := nodes[(r+1)%ranks]
		if err := n.T.Connect(ctx, right.ID, right.Addr); err != nil {
			t.Fatal(err)
		}
	}
	errs := make(chan error, ranks)
	for r, n := range nodes {
		right, left := nodes[(r+1)%ranks], nodes[(r+ranks-1)%ranks]
		go func() {
			p := make([]byte, size)
			buf := make([]byte, size)
			for k := range rounds {
				transporttest.FillPattern(p, uint64(r*rounds+k))
				if err := n.T.Send(ctx, right.ID, transport.ChanData, hdr(k), p); err != nil {
					errs <- err
					return
				}
				h, got, err := n.T.Recv(ctx, left.ID, transport.ChanData, buf)
				if err == nil && (h.Seq != uint64(k) || got != size) {
					err = fmt.Errorf("rank %d round %d: got seq %d, %d bytes", r, k, h.Seq, got)
				}
				if err == nil {
					err = transporttest.CheckPattern(buf, uint64(((r+ranks-1)%ranks)*rounds+k))
				}
				if err != nil {
					errs <- fmt.Errorf("rank %d round %d: %w", r, k, err)
					return
				}
			}
			errs <- nil
		}()
	}
	for range ranks {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}

func BenchmarkOneWay(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(transporttest.SizeName(size), func(b *testing.B) {
			transporttest.BenchmarkOneWay(b, newNodes(b, 2), size)
		})
	}
}

func BenchmarkRoundTrip(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(transporttest.SizeName(size), func(b *testing.B) {
			transporttest.BenchmarkRoundTrip(b, newNodes(b, 2), size)
		})
	}
}

var benchSizes = []int{4 << 10, 1 << 20, 64 << 20}

func joinID(tb testing.TB, net *mem.Network, id transport.PeerID) transporttest.Node {
	tb.Helper()
	tr, err := net.Join(id)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	return transporttest.Node{ID: id, T: tr, Addr: tr.Addr()}
}

// TestFreeze: a frozen node is silent without an error anywhere: its
// calls block, what is sent to it queues, and after Thaw everything
// carries on in order.
func TestFreeze(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	send(t, ctx, a, b, 1) // sent before the freeze: still delivered
	net.Freeze(a.ID)
	expectSeq(t, ctx, b, a.ID, 1)
	send(t, ctx, b, a, 2) // queues for the frozen node
	send(t, ctx, b, c, 3) // the others are unaffected
	expectSeq(t, ctx, c, b.ID, 3)

	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := a.T.Send(short, b.ID, transport.ChanData, hdr(4), nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("frozen Send = %v, want it blocked until its deadline", err)
	}
	if _, err := recvSeq(short, a, b.ID); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("frozen Recv = %v, want it blocked until its deadline", err)
	}
	expectLost(t, ctx, b, a.ID)

	// A Recv blocked by the freeze carries on after Thaw.
	got := make(chan error, 1)
	go func() {
		seq, err := recvSeq(ctx, a, b.ID)
		if err == nil && seq != 2 {
			err = fmt.Errorf("got seq %d, want 2", seq)
		}
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	net.Thaw(a.ID)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	send(t, ctx, a, b, 5)
	expectSeq(t, ctx, b, a.ID, 5)
}

// TestFreezeThenKill: closing or killing a frozen node unblocks its calls.
func TestFreezeThenKill(t *testing.T) {
	net := mem.NewNetwork(1)
	nodes, ctx := connected(t, net, 2)
	a, b := nodes[0], nodes[1]
	net.Freeze(a.ID)
	got := make(chan error, 1)
	go func() {
		_, err := recvSeq(ctx, a, b.ID)
		got <- err
	}()
	net.Kill(a.ID)
	if err := <-got; !errors.Is(err, transport.ErrClosed) {
		t.Fatalf("frozen Recv after Kill = %v, want ErrClosed", err)
	}
}
