package transporttest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// Timing bounds of the suite. They are generous because CI runs the suite
// with -race on two shared cores, yet far below the case deadlines, so a
// call that only returns at its deadline is told apart from a prompt one.
const (
	caseTimeout  = 30 * time.Second // deadline of every blocking call in a case
	largeTimeout = 2 * time.Minute  // deadline in the case that moves largeMessage
	settle       = 50 * time.Millisecond
	promptly     = 750 * time.Millisecond // bound on unblocking by cancel or Close
	goneWithin   = 5 * time.Second        // bound on noticing that a peer closed
	ignoreGrace  = 5 * time.Second        // how long a call may outlive its context
)

type suiteCase struct {
	name    string
	nodes   int
	timeout time.Duration
	// leaks makes Run snapshot goroutines before creating the nodes and
	// check that none were left once the case closed them.
	leaks bool
	run   func(t *testing.T, ctx context.Context, nodes []Node)
}

var cases = []suiteCase{
	{name: "Sizes", nodes: 2, timeout: largeTimeout, run: testSizes},
	{name: "ManySmallInOrder", nodes: 2, run: testManySmall},
	{name: "ConcurrentSendersWhole", nodes: 2, run: testConcurrentSenders},
	{name: "Duplex", nodes: 2, run: testDuplex},
	{name: "ChannelsIndependent", nodes: 2, run: testChannels},
	{name: "PeersKeptApart", nodes: 3, run: testPeersApart},
	{name: "ShortBuffer", nodes: 2, run: testShortBuffer},
	{name: "RecvWithoutConnect", nodes: 2, run: testRecvWithoutConnect},
	{name: "Errors", nodes: 2, run: testErrors},
	{name: "Cancel", nodes: 2, run: testCancel},
	{name: "Close", nodes: 2, run: testClose},
	{name: "PeerGone", nodes: 2, run: testPeerGone},
	{name: "NoLeaks", nodes: 3, leaks: true, run: testNoLeaks},
	{name: "DropReconnectNoLeaks", nodes: 2, run: testDropReconnect},
	{name: "Forget", nodes: 2, run: testForget},
	{name: "Reopen", nodes: 2, run: testReopen},
}

// Run runs every conformance subtest (t.Run per case) against fresh nodes
// from newNodes. The cases run one after another, never in parallel, to
// keep the load small on shared machines.
func Run(t *testing.T, newNodes NewNodes) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var leakOpt goleak.Option
			if c.leaks {
				leakOpt = goleak.IgnoreCurrent()
			}
			nodes := newNodes(t, c.nodes)
			if len(nodes) != c.nodes {
				t.Fatalf("NewNodes(%d) returned %d nodes", c.nodes, len(nodes))
			}
			// Closing the nodes also ends any goroutine a failed case left
			// blocked in a transport call.
			defer closeAll(nodes)
			timeout := c.timeout
			if timeout == 0 {
				timeout = caseTimeout
			}
			ctx, cancel := context.WithTimeout(t.Context(), timeout)
			defer cancel()
			c.run(t, ctx, nodes)
			if c.leaks {
				closeAll(nodes)
				cancel()
				goleak.VerifyNone(t, leakOpt)
			}
		})
	}
}

func closeAll(nodes []Node) {
	for _, n := range nodes {
		n.T.Close()
	}
}

func connect(t *testing.T, ctx context.Context, from, to Node) {
	t.Helper()
	if err := from.T.Connect(ctx, to.ID, to.Addr); err != nil {
		t.Fatalf("%s connect to %s at %s: %v", from.ID, to.ID, to.Addr, err)
	}
}

// await returns what a goroutine of the case sends on c. The goroutine's
// calls carry ctx, so it must finish by ctx's end; if it is still blocked
// ignoreGrace later, the transport ignores contexts and the test fails
// instead of hanging.
func await[T any](tb testing.TB, ctx context.Context, what string, c <-chan T) T {
	tb.Helper()
	select {
	case v := <-c:
		return v
	case <-ctx.Done():
	}
	select {
	case v := <-c:
		return v
	case <-time.After(ignoreGrace):
		tb.Fatalf("%s: still blocked %v after its context ended", what, ignoreGrace)
		panic("unreachable")
	}
}

// wait awaits a goroutine started by async and fails the test with its
// error, saying what the goroutine was doing.
func wait(t *testing.T, ctx context.Context, what string, c <-chan error) {
	t.Helper()
	if err := await(t, ctx, what, c); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// recvCheck receives one message and checks its header against want (with
// Len = n) and its payload against the pattern for seed.
func recvCheck(ctx context.Context, node Node, from transport.PeerID, ch transport.Channel, buf []byte, want wire.Header, n int, seed uint64) error {
	h, got, err := node.T.Recv(ctx, from, ch, buf)
	if err != nil {
		return fmt.Errorf("%s recv from %s on %v: %w", node.ID, from, ch, err)
	}
	if got != n {
		return fmt.Errorf("%s recv from %s on %v: got %d bytes, want %d (header %+v)", node.ID, from, ch, got, n, h)
	}
	if err := checkHeader(h, want, n); err != nil {
		return fmt.Errorf("%s recv from %s on %v: %w", node.ID, from, ch, err)
	}
	if err := CheckPattern(buf[:got], seed); err != nil {
		return fmt.Errorf("%s recv from %s on %v, message %+v: %w", node.ID, from, ch, h, err)
	}
	return nil
}

// largeMessage is the largest message of testSizes: 12 frames and a short
// one, cut over every stripe the suite's configurations have, and more
// than a QUIC connection's initial flow-control windows (8 MiB), so it
// moves only as the receiver reads. It was 64 MiB, which takes no other
// path; under -race each MiB costs about 0.1 s of CPU, mostly the race
// detector's shadow of the buffers.
const largeMessage = 12<<20 + 5

// testSizes sends messages from empty to largeMessage, each with a
// distinct header, and checks that they arrive intact and in order.
func testSizes(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	sizes := []int{0, 1, 64 << 10, largeMessage}
	sent := async(func() error {
		for i, n := range sizes {
			p := make([]byte, n)
			FillPattern(p, uint64(i))
			if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(i), p); err != nil {
				return fmt.Errorf("send %d bytes: %w", n, err)
			}
		}
		return nil
	})
	buf := make([]byte, sizes[len(sizes)-1])
	for i, n := range sizes {
		if err := recvCheck(ctx, b, a.ID, transport.ChanData, buf, testHeader(i), n, uint64(i)); err != nil {
			t.Fatalf("message %d of %d bytes: %v", i, n, err)
		}
	}
	wait(t, ctx, "sender", sent)
}

// testManySmall sends a long run of small messages from one reused buffer:
// they must arrive in order, and reusing the buffer once Send returns must
// not change what was sent.
func testManySmall(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	const count = 500
	size := func(i int) int { return i * 7 % 300 }
	sent := async(func() error {
		p := make([]byte, 300)
		for i := range count {
			FillPattern(p[:size(i)], uint64(i))
			if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(i), p[:size(i)]); err != nil {
				return fmt.Errorf("send message %d: %w", i, err)
			}
			clear(p) // the caller may reuse the buffer as soon as Send returns
		}
		return nil
	})
	buf := make([]byte, 512)
	for i := range count {
		if err := recvCheck(ctx, b, a.ID, transport.ChanData, buf, testHeader(i), size(i), uint64(i)); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	wait(t, ctx, "sender", sent)
}

// testConcurrentSenders has several goroutines send on the same (peer,
// channel) at once, with messages larger than a frame, and checks that every
// message arrives whole and each goroutine's messages keep their order.
func testConcurrentSenders(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	const senders, each = 4, 6
	sizes := []int{3000, wire.DefaultMaxFrame + 4099, 70000}
	header := func(g, k int) wire.Header {
		h := testHeader(g*each + k)
		h.Step, h.Chunk = uint32(g), uint32(k)
		return h
	}
	seed := func(g, k int) uint64 { return uint64(g)<<32 | uint64(k) }
	var done [senders]<-chan error
	for g := range senders {
		done[g] = async(func() error {
			for k := range each {
				p := make([]byte, sizes[k%len(sizes)])
				FillPattern(p, seed(g, k))
				if err := a.T.Send(ctx, b.ID, transport.ChanData, header(g, k), p); err != nil {
					return fmt.Errorf("sender %d message %d: %w", g, k, err)
				}
			}
			return nil
		})
	}
	buf := make([]byte, 2*wire.DefaultMaxFrame)
	var next [senders]int
	for range senders * each {
		h, n, err := b.T.Recv(ctx, a.ID, transport.ChanData, buf)
		if err != nil {
			t.Fatalf("recv: %v", err)
		}
		g, k := int(h.Step), int(h.Chunk)
		if g >= senders || k != next[g] {
			t.Fatalf("got message %d of sender %d, want message %d (header %+v)", k, g, next[min(g, senders-1)], h)
		}
		next[g]++
		if err := checkHeader(h, header(g, k), sizes[k%len(sizes)]); err != nil {
			t.Fatalf("sender %d message %d: %v", g, k, err)
		}
		if err := CheckPattern(buf[:n], seed(g, k)); err != nil {
			t.Fatalf("sender %d message %d is not whole: %v", g, k, err)
		}
	}
	for g := range senders {
		wait(t, ctx, "sender", done[g])
	}
}

// testDuplex has both ends send and receive at the same time over one pair,
// as neighbours in a ring do.
func testDuplex(t *testing.T, ctx context.Context, nodes []Node) {
	ConnectAll(t, ctx, nodes)
	const count, size = 8, 256 << 10
	flow := func(from, to Node, base int) (send, recv <-chan error) {
		send = async(func() error {
			p := make([]byte, size)
			for i := range count {
				FillPattern(p, uint64(base+i))
				if err := from.T.Send(ctx, to.ID, transport.ChanData, testHeader(base+i), p); err != nil {
					return fmt.Errorf("%s send %d: %w", from.ID, i, err)
				}
			}
			return nil
		})
		recv = async(func() error {
			buf := make([]byte, size)
			for i := range count {
				if err := recvCheck(ctx, to, from.ID, transport.ChanData, buf, testHeader(base+i), size, uint64(base+i)); err != nil {
					return fmt.Errorf("message %d: %w", i, err)
				}
			}
			return nil
		})
		return send, recv
	}
	s1, r1 := flow(nodes[0], nodes[1], 0)
	s2, r2 := flow(nodes[1], nodes[0], 100)
	wait(t, ctx, "send 0→1", s1)
	wait(t, ctx, "send 1→0", s2)
	wait(t, ctx, "recv 0→1", r1)
	wait(t, ctx, "recv 1→0", r2)
}

// testChannels checks that a Recv on one channel never consumes a message
// sent on another, whatever the order of sends and receives.
func testChannels(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	buf := make([]byte, 64)
	send := func(ch transport.Channel, i int) {
		t.Helper()
		p := make([]byte, 10+i)
		FillPattern(p, uint64(i))
		if err := a.T.Send(ctx, b.ID, ch, testHeader(i), p); err != nil {
			t.Fatalf("send message %d on %v: %v", i, ch, err)
		}
	}
	recv := func(ch transport.Channel, i int) {
		t.Helper()
		if err := recvCheck(ctx, b, a.ID, ch, buf, testHeader(i), 10+i, uint64(i)); err != nil {
			t.Fatalf("want message %d: %v", i, err)
		}
	}

	// Sent control, data, probe; received data, probe, control.
	send(transport.ChanControl, 1)
	send(transport.ChanData, 2)
	send(transport.ChanProbe, 3)
	recv(transport.ChanData, 2)
	recv(transport.ChanProbe, 3)
	recv(transport.ChanControl, 1)

	// The reverse order.
	send(transport.ChanData, 4)
	send(transport.ChanControl, 5)
	recv(transport.ChanControl, 5)
	recv(transport.ChanData, 4)

	// A Recv pending on control while a data message arrives must keep
	// waiting for its own channel.
	pending := asyncRecv(ctx, b, a.ID, transport.ChanControl, make([]byte, 64))
	send(transport.ChanData, 6)
	time.Sleep(settle)
	send(transport.ChanControl, 7)
	r := await(t, ctx, "pending control recv", pending)
	if r.err != nil {
		t.Fatalf("pending control recv: %v", r.err)
	}
	if err := checkHeader(r.hdr, testHeader(7), 10+7); err != nil {
		t.Fatalf("pending control recv got another channel's message: %v", err)
	}
	recv(transport.ChanData, 6)
}

// testPeersApart has two senders write to one receiver on the same channel;
// the receiver drains one sender, then the other.
func testPeersApart(t *testing.T, ctx context.Context, nodes []Node) {
	a, b, c := nodes[0], nodes[1], nodes[2]
	connect(t, ctx, a, b)
	connect(t, ctx, c, b)
	const count = 20
	sender := func(from Node, base int) <-chan error {
		return async(func() error {
			for i := range count {
				p := make([]byte, 100+i)
				FillPattern(p, uint64(base+i))
				if err := from.T.Send(ctx, b.ID, transport.ChanData, testHeader(base+i), p); err != nil {
					return fmt.Errorf("%s send %d: %w", from.ID, i, err)
				}
			}
			return nil
		})
	}
	sa, sc := sender(a, 0), sender(c, 1000)
	buf := make([]byte, 256)
	for _, from := range []struct {
		node Node
		base int
	}{{c, 1000}, {a, 0}} {
		for i := range count {
			if err := recvCheck(ctx, b, from.node.ID, transport.ChanData, buf, testHeader(from.base+i), 100+i, uint64(from.base+i)); err != nil {
				t.Fatalf("message %d from %s: %v", i, from.node.ID, err)
			}
		}
	}
	wait(t, ctx, "sender a", sa)
	wait(t, ctx, "sender c", sc)
}

// testShortBuffer checks that a message too long for the buffer is reported
// with wire.ErrShortBuffer and discarded, leaving the channel in step.
func testShortBuffer(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	sizes := []int{wire.DefaultMaxFrame + wire.DefaultMaxFrame/2 + 3, 10, 100, 0}
	sent := async(func() error {
		for i, n := range sizes {
			p := make([]byte, n)
			FillPattern(p, uint64(i))
			if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(i), p); err != nil {
				return fmt.Errorf("send message %d: %w", i, err)
			}
		}
		return nil
	})
	buf := make([]byte, 1024)
	_, _, err := b.T.Recv(ctx, a.ID, transport.ChanData, buf)
	if !errors.Is(err, wire.ErrShortBuffer) {
		t.Fatalf("recv of %d bytes into %d: got %v, want an error wrapping wire.ErrShortBuffer", sizes[0], len(buf), err)
	}
	if errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("short buffer must not end the peer: %v", err)
	}
	if err := recvCheck(ctx, b, a.ID, transport.ChanData, buf, testHeader(1), sizes[1], 1); err != nil {
		t.Fatalf("message after the discarded one: %v", err)
	}
	if err := recvCheck(ctx, b, a.ID, transport.ChanData, buf[:sizes[2]], testHeader(2), sizes[2], 2); err != nil {
		t.Fatalf("message that fits its buffer exactly: %v", err)
	}
	if err := recvCheck(ctx, b, a.ID, transport.ChanData, nil, testHeader(3), 0, 3); err != nil {
		t.Fatalf("empty message into a nil buffer: %v", err)
	}
	wait(t, ctx, "sender", sent)
}

// testRecvWithoutConnect has the receiver wait before the sender has even
// connected, and never connect itself.
func testRecvWithoutConnect(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	pending := asyncRecv(ctx, b, a.ID, transport.ChanData, make([]byte, 64))
	time.Sleep(settle)
	connect(t, ctx, a, b)
	for i := range 2 {
		p := make([]byte, 20+i)
		FillPattern(p, uint64(i))
		if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(i), p); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
	}
	r := await(t, ctx, "recv pending before connect", pending)
	if r.err != nil {
		t.Fatalf("recv pending before connect: %v", r.err)
	}
	if err := checkHeader(r.hdr, testHeader(0), 20); err != nil {
		t.Fatal(err)
	}
	if err := recvCheck(ctx, b, a.ID, transport.ChanData, make([]byte, 64), testHeader(1), 21, 1); err != nil {
		t.Fatal(err)
	}
}

// testErrors checks the typed errors for misuse, and that they leave the
// transport usable.
func testErrors(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	p := []byte("hello")
	for _, peer := range []transport.PeerID{b.ID, "nobody"} {
		if err := a.T.Send(ctx, peer, transport.ChanData, testHeader(0), p); !errors.Is(err, transport.ErrNotConnected) {
			t.Errorf("send to %s before connect: got %v, want ErrNotConnected", peer, err)
		}
	}
	connect(t, ctx, a, b)
	connect(t, ctx, a, b) // idempotent
	for _, ch := range []transport.Channel{transport.NumChannels, 255} {
		if err := a.T.Send(ctx, b.ID, ch, testHeader(0), p); !errors.Is(err, transport.ErrBadChannel) {
			t.Errorf("send on %v: got %v, want ErrBadChannel", ch, err)
		}
		if _, _, err := b.T.Recv(ctx, a.ID, ch, make([]byte, 8)); !errors.Is(err, transport.ErrBadChannel) {
			t.Errorf("recv on %v: got %v, want ErrBadChannel", ch, err)
		}
	}
	// A header the receiver's decoder would reject is the caller's bug: the
	// sender refuses it and the peer stays usable.
	for _, h := range []wire.Header{{}, {Kind: wire.KindData, DType: 200}, {Kind: wire.KindData, Op: 200}} {
		if err := a.T.Send(ctx, b.ID, transport.ChanData, h, p); !errors.Is(err, wire.ErrMalformed) {
			t.Errorf("send with header %+v: got %v, want wire.ErrMalformed", h, err)
		}
	}
	FillPattern(p, 9)
	if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(9), p); err != nil {
		t.Fatalf("send after errors: %v", err)
	}
	if err := recvCheck(ctx, b, a.ID, transport.ChanData, make([]byte, 8), testHeader(9), len(p), 9); err != nil {
		t.Fatalf("recv after errors: %v", err)
	}
}

// unblocked waits for a pending Recv and checks that it returned an error
// matching want within promptly of since.
func unblocked(t *testing.T, what string, c <-chan recvResult, since time.Time, want error) {
	t.Helper()
	var r recvResult
	select {
	case r = <-c:
	case <-time.After(time.Until(since) + goneWithin):
		t.Fatalf("%s: still blocked after %v", what, goneWithin)
	}
	if d := time.Since(since); d > promptly {
		t.Errorf("%s: returned after %v, want under %v", what, d, promptly)
	}
	if !errors.Is(r.err, want) {
		t.Errorf("%s: got %v, want %v", what, r.err, want)
	}
}

// testCancel checks that a pending Recv ends promptly when its context is
// cancelled or reaches its deadline, from a connected peer and from one that
// never connected, and that the channel still works afterwards.
func testCancel(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	for _, from := range []transport.PeerID{a.ID, "nobody"} {
		cctx, cancel := context.WithCancel(ctx)
		pending := asyncRecv(cctx, b, from, transport.ChanData, make([]byte, 8))
		time.Sleep(settle)
		cancel()
		unblocked(t, fmt.Sprintf("recv from %s after cancel", from), pending, time.Now(), context.Canceled)

		const d = 100 * time.Millisecond
		dctx, dcancel := context.WithTimeout(ctx, d)
		start := time.Now()
		pending = asyncRecv(dctx, b, from, transport.ChanData, make([]byte, 8))
		unblocked(t, fmt.Sprintf("recv from %s with deadline", from), pending, start.Add(d), context.DeadlineExceeded)
		dcancel()
	}
	p := make([]byte, 8)
	FillPattern(p, 1)
	if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(1), p); err != nil {
		t.Fatalf("send after cancelled recvs: %v", err)
	}
	if err := recvCheck(ctx, b, a.ID, transport.ChanData, make([]byte, 8), testHeader(1), 8, 1); err != nil {
		t.Fatalf("recv after cancelled recvs: %v", err)
	}
}

// testClose checks that Close unblocks pending calls with ErrClosed, that
// every later call returns ErrClosed, and that Close is idempotent.
func testClose(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	fromA := asyncRecv(ctx, b, a.ID, transport.ChanData, make([]byte, 8))
	fromNobody := asyncRecv(ctx, b, "nobody", transport.ChanControl, make([]byte, 8))
	time.Sleep(settle)
	start := time.Now()
	if err := b.T.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	unblocked(t, "recv from a connected peer pending at Close", fromA, start, transport.ErrClosed)
	unblocked(t, "recv from an unknown peer pending at Close", fromNobody, start, transport.ErrClosed)

	if err := b.T.Connect(ctx, a.ID, a.Addr); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Connect after Close: got %v, want ErrClosed", err)
	}
	if err := b.T.Send(ctx, a.ID, transport.ChanData, testHeader(0), nil); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Send after Close: got %v, want ErrClosed", err)
	}
	if _, _, err := b.T.Recv(ctx, a.ID, transport.ChanData, nil); !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Recv after Close: got %v, want ErrClosed", err)
	}
	for i := range 2 {
		if err := b.T.Close(); err != nil {
			t.Errorf("Close again (%d): %v", i+1, err)
		}
	}
}

// testPeerGone checks that when a peer closes, a Recv pending on it fails
// soon with an error that matches ErrPeerGone and names the peer.
func testPeerGone(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	connect(t, ctx, a, b)
	p := make([]byte, 100)
	FillPattern(p, 1)
	if err := a.T.Send(ctx, b.ID, transport.ChanData, testHeader(1), p); err != nil {
		t.Fatalf("send: %v", err)
	}
	buf := make([]byte, 100)
	if err := recvCheck(ctx, b, a.ID, transport.ChanData, buf, testHeader(1), 100, 1); err != nil {
		t.Fatal(err)
	}
	pending := asyncRecv(ctx, b, a.ID, transport.ChanData, buf)
	time.Sleep(settle)
	start := time.Now()
	if err := a.T.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	var r recvResult
	select {
	case r = <-pending:
	case <-time.After(goneWithin):
		t.Fatalf("recv from a closed peer still pending after %v", goneWithin)
	}
	t.Logf("peer gone noticed after %v: %v", time.Since(start), r.err)
	if !errors.Is(r.err, transport.ErrPeerGone) {
		t.Fatalf("recv from a closed peer: got %v, want an error matching ErrPeerGone", r.err)
	}
	if peer, ok := transport.PeerOf(r.err); !ok || peer != a.ID {
		t.Errorf("PeerOf(%v) = %q, %v; want %q", r.err, peer, ok, a.ID)
	}
}

// testNoLeaks uses the nodes in every way, leaves calls pending, and lets Run
// check after closing that no goroutine outlived them.
func testNoLeaks(t *testing.T, ctx context.Context, nodes []Node) {
	ConnectAll(t, ctx, nodes)
	var done []<-chan error
	for i, from := range nodes {
		for j, to := range nodes {
			if i == j {
				continue
			}
			done = append(done, async(func() error {
				p := make([]byte, 4096)
				FillPattern(p, uint64(i*10+j))
				return from.T.Send(ctx, to.ID, transport.ChanControl, testHeader(i*10+j), p)
			}))
			done = append(done, async(func() error {
				return recvCheck(ctx, to, from.ID, transport.ChanControl, make([]byte, 4096), testHeader(i*10+j), 4096, uint64(i*10+j))
			}))
		}
	}
	for _, c := range done {
		wait(t, ctx, "exchange", c)
	}
	// Leave one call pending at close, to be ended by it.
	pending := asyncRecv(ctx, nodes[0], nodes[1].ID, transport.ChanData, make([]byte, 8))
	time.Sleep(settle)
	closeAll(nodes)
	if r := await(t, ctx, "recv pending at close", pending); !errors.Is(r.err, transport.ErrClosed) && !errors.Is(r.err, transport.ErrPeerGone) {
		t.Errorf("recv pending at close: got %v, want ErrClosed or ErrPeerGone", r.err)
	}
}

// testReopen: a receive cancelled while a large message arrives leaves
// the stream out of step (or, if it was cancelled before any byte, in
// step with the message still queued). Once both sides reopen the
// channel (transport.Reopener), the next message arrives intact, after
// at most the old message whole: nothing is read from the middle of one.
// Transports without Reopener (mem, whose messages never break) skip it.
func testReopen(t *testing.T, ctx context.Context, nodes []Node) {
	a, b := nodes[0], nodes[1]
	ra, okA := a.T.(transport.Reopener)
	rb, okB := b.T.(transport.Reopener)
	if !okA || !okB {
		t.Skip("the transport has no Reopener")
	}
	connect(t, ctx, a, b)
	const big = 32 << 20
	old := make([]byte, big)
	FillPattern(old, 1)
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	sent := async(func() error {
		a.T.Send(sctx, b.ID, transport.ChanData, testHeader(1), old) // may fail: b gives up on it
		return nil
	})
	buf := make([]byte, big)
	short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
	_, _, err := b.T.Recv(short, a.ID, transport.ChanData, buf)
	cancel()
	cut := err != nil
	if cut && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a receive cancelled by its context: %v", err)
	}
	stop()
	wait(t, ctx, "the large send", sent)
	// A view change reopens long after the old view's last message, when
	// its streams have all been accepted. Here a's streams, reset by its
	// cancelled send, may still be in flight: a stream accepted after b's
	// Reopen cannot be told from a new one, and its reset would fail a
	// receive.
	time.Sleep(100 * time.Millisecond)

	rb.Reopen(a.ID, transport.ChanData)
	ra.Reopen(b.ID, transport.ChanData)
	// The cut may have failed a's send and abandoned its link; a new
	// view connects before it sends, and so does this.
	connect(t, ctx, a, b)
	next := make([]byte, 4096)
	FillPattern(next, 2)
	sent = async(func() error { return a.T.Send(ctx, b.ID, transport.ChanData, testHeader(2), next) })
	for {
		h, n, err := b.T.Recv(ctx, a.ID, transport.ChanData, buf)
		if err != nil {
			t.Fatalf("receive after both reopened (the first was cut: %v): %v", cut, err)
		}
		if h.Seq == testHeader(1).Seq && n == big && CheckPattern(buf[:n], 1) == nil {
			continue // the old message, whole: it was never started
		}
		if err := checkHeader(h, testHeader(2), len(next)); err != nil || n != len(next) || CheckPattern(buf[:n], 2) != nil {
			t.Fatalf("after both reopened, got %d bytes with header %+v (%v); want the new message whole", n, h, err)
		}
		break
	}
	wait(t, ctx, "the send after reopening", sent)
}
