package streams

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// testNet connects cores in process through loopback TCP pairs: a Link's
// OpenStream makes a pair and hands one end to the target core's Accept,
// as a real transport's accept loop would, with the dialer's ID as the
// verified name.
type testNet struct {
	mu    sync.Mutex
	nodes map[string]*Transport
	ln    net.Listener
	pairs sync.Mutex
	// accepted, if set, wraps each accepted end before Accept.
	accepted func(net.Conn) InStream
}

func newTestNet(tb testing.TB) *testNet {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return &testNet{nodes: make(map[string]*Transport), ln: ln}
}

func (n *testNet) pair() (net.Conn, net.Conn, error) {
	n.pairs.Lock()
	defer n.pairs.Unlock()
	a, err := net.Dial("tcp", n.ln.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	b, err := n.ln.Accept()
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

var errNoSuchNode = errors.New("no node at that address")

func (n *testNet) add(tb testing.TB, id string, adjust func(*Config)) *Transport {
	tb.Helper()
	from := transport.PeerID(id)
	cfg := Config{ID: from, Logger: transporttest.Logger(tb)}
	cfg.Dial = func(ctx context.Context, peer transport.PeerID, addr string) (Link, error) {
		n.mu.Lock()
		dst := n.nodes[addr]
		n.mu.Unlock()
		if dst == nil {
			return nil, errNoSuchNode
		}
		return &testLink{net: n, from: from, dst: dst}, nil
	}
	tr := transporttest.Start(tb, cfg, adjust, New)
	n.mu.Lock()
	n.nodes[id] = tr
	n.mu.Unlock()
	return tr
}

type testLink struct {
	net  *testNet
	from transport.PeerID
	dst  *Transport
}

func (l *testLink) OpenStream(ctx context.Context, _ transport.Channel) (Stream, error) {
	a, b, err := l.net.pair()
	if err != nil {
		return nil, err
	}
	if l.net.accepted != nil {
		l.dst.Accept(l.from, l.net.accepted(b))
	} else {
		l.dst.Accept(l.from, b)
	}
	return a, nil
}

func (l *testLink) Close() error { return nil }

func newNodes(adjust func(*Config)) transporttest.NewNodes {
	return func(tb testing.TB, n int) []transporttest.Node {
		tb.Helper()
		tn := newTestNet(tb)
		nodes := make([]transporttest.Node, n)
		for i := range nodes {
			id := fmt.Sprintf("node-%d", i)
			nodes[i] = transporttest.Node{ID: transport.PeerID(id), T: tn.add(tb, id, adjust), Addr: id}
		}
		return nodes
	}
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, newNodes(nil))
}

// TestConformanceStripesSmallFrames runs the suite with 4 stripes and a
// small frame limit, so striped messages span many frames per stripe.
func TestConformanceStripesSmallFrames(t *testing.T) {
	transporttest.Run(t, newNodes(func(c *Config) {
		c.Stripes = 4
		c.Limits = wire.Limits{MaxFrame: 16 << 10, MaxMessage: wire.DefaultMaxMessage}
	}))
}

func TestNewValidates(t *testing.T) {
	dial := func(context.Context, transport.PeerID, string) (Link, error) { return nil, nil }
	for name, cfg := range map[string]Config{
		"no id":      {Dial: dial},
		"long id":    {ID: transport.PeerID(strings.Repeat("x", 256)), Dial: dial},
		"no dial":    {ID: "a"},
		"stripes":    {ID: "a", Dial: dial, Stripes: 256},
		"bad limits": {ID: "a", Dial: dial, Limits: wire.Limits{MaxFrame: 1}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("%s: New accepted %+v", name, cfg)
		}
	}
}

func TestConnectError(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	refuse := fmt.Errorf("%w: test", transport.ErrUnauthenticated)
	calls := 0
	tr, err := New(Config{ID: "a", Stripes: 2, Dial: func(context.Context, transport.PeerID, string) (Link, error) {
		calls++
		return nil, refuse
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	for i := range 2 { // a failed Connect is not remembered: it is retried
		err := tr.Connect(ctx, "b", "b")
		var pe *transport.PeerError
		if !errors.As(err, &pe) || pe.Op != "connect" || pe.Peer != "b" || !errors.Is(err, transport.ErrUnauthenticated) {
			t.Fatalf("Connect %d: %v, want a connect PeerError wrapping ErrUnauthenticated", i, err)
		}
	}
	if calls != 2 {
		t.Fatalf("Dial called %d times, want 2", calls)
	}
	if err := tr.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData}, nil); !errors.Is(err, transport.ErrNotConnected) {
		t.Fatalf("Send after failed Connect: %v, want ErrNotConnected", err)
	}
}

func TestAcceptRejectsBadHellos(t *testing.T) {
	var log transporttest.LogBuffer
	tn := newTestNet(t)
	a := tn.add(t, "a", func(c *Config) { c.Logger = zerolog.New(&log) })
	for _, tc := range []struct {
		name     string
		verified transport.PeerID
		hello    []byte
		want     string
	}{
		{"garbage", "b", []byte("GET / HTTP/1.1\r\n\r\n"), "bad hello magic"},
		{"impostor", "b", wire.AppendHello(nil, wire.Hello{From: "c", Stripes: 1}), `certificate names \"b\"`},
		{"unknown channel", "b", wire.AppendHello(nil, wire.Hello{From: "b", Channel: 9, Stripes: 1}), "unknown channel 9"},
		{"stripe out of range", "", wire.AppendHello(nil, wire.Hello{From: "b", Stripe: 2, Stripes: 2}), "stripe 2 of 2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, s, err := tn.pair()
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			a.Accept(tc.verified, s)
			c.Write(tc.hello)
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
				t.Fatalf("stream with a bad hello not closed: %v", err)
			}
			log.Wait(t, tc.want)
		})
	}
}

// TestReopenedChannelQueues checks that when a peer opens a channel anew
// (it restarted, or a cancelled Send made it start over), the messages
// still unread on the old streams are received first, then the new ones.
func TestReopenedChannelQueues(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tn := newTestNet(t)
	a := tn.add(t, "a", nil)
	tn.add(t, "b", nil)
	send := func(c net.Conn, seq uint64) {
		w := wire.NewWriter(c, wire.DefaultMaxFrame)
		if err := w.WriteMessage(wire.Header{Kind: wire.KindData, Seq: seq}, []byte{byte(seq)}); err != nil {
			t.Fatal(err)
		}
	}
	open := func() net.Conn {
		c, s, err := tn.pair()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a.Accept("b", s)
		c.Write(wire.AppendHello(nil, wire.Hello{From: "b", Stripes: 1}))
		return c
	}
	old := open()
	send(old, 1)
	send(old, 2)
	buf := make([]byte, 8)
	recv := func(want uint64) {
		t.Helper()
		h, _, err := a.Recv(ctx, "b", transport.ChanData, buf)
		if err != nil || h.Seq != want {
			t.Fatalf("Recv: seq %d, %v; want seq %d", h.Seq, err, want)
		}
	}
	recv(1)
	fresh := open()
	send(fresh, 3)
	time.Sleep(100 * time.Millisecond) // let a register the new stream
	old.Close()
	recv(2)
	recv(3)
}

// TestStaleStreamsGiveWayAfterReopen checks the two ways streams the
// peer left behind show up after this side's Reopen, and that in both the
// receive skips them for the peer's next message instead of failing or
// waiting: a striped message whose second stripe was reset before its
// hello (it never arrives), and a stream accepted before the Reopen whose
// hello is read after it, cut mid-message.
func TestStaleStreamsGiveWayAfterReopen(t *testing.T) {
	big := make([]byte, wire.StripeMin)
	for _, tc := range []struct {
		name string
		// stale leaves the old streams in a: it returns a func that runs
		// after a's Reopen.
		stale func(t *testing.T, tn *testNet, a *Transport) func()
	}{
		{"stripe never arrives", func(t *testing.T, tn *testNet, a *Transport) func() {
			c := openRaw(t, tn, a, 2)
			h := wire.Header{Kind: wire.KindData, Seq: 1, Len: uint64(len(big))}
			_, hi := wire.StripePart(h.Len, 2, 0)
			if err := wire.NewWriter(c, wire.DefaultMaxFrame).WriteFrames(h, big[:hi], 0); err != nil {
				t.Fatal(err)
			}
			return func() {}
		}},
		{"accepted before the reopen", func(t *testing.T, tn *testNet, a *Transport) func() {
			c, s, err := tn.pair()
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			a.Accept("b", s) // its hello comes after the Reopen
			return func() {
				c.Write(wire.AppendHello(nil, wire.Hello{From: "b", Stripes: 1}))
				h := wire.Header{Kind: wire.KindData, Seq: 1, Len: 64}
				if err := wire.NewWriter(c, wire.DefaultMaxFrame).WriteFrames(h, make([]byte, 16), 0); err != nil {
					t.Fatal(err)
				}
				time.Sleep(50 * time.Millisecond) // registered before the next
				c.Close()                         // cut mid-message
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			tn := newTestNet(t)
			a := tn.add(t, "a", nil)
			tn.add(t, "b", nil)
			after := tc.stale(t, tn, a)
			time.Sleep(50 * time.Millisecond) // registered, if its hello came
			a.Reopen("b", transport.ChanData)
			after()
			got := make(chan error, 1)
			buf := make([]byte, len(big))
			go func() {
				h, n, err := a.Recv(ctx, "b", transport.ChanData, buf)
				if err == nil && (h.Seq != 2 || n != 1) {
					err = fmt.Errorf("got seq %d of %d bytes, want seq 2 of 1", h.Seq, n)
				}
				got <- err
			}()
			time.Sleep(50 * time.Millisecond) // reading the old streams
			fresh := openRaw(t, tn, a, 2)
			if err := wire.NewWriter(fresh, wire.DefaultMaxFrame).WriteMessage(wire.Header{Kind: wire.KindData, Seq: 2}, []byte{2}); err != nil {
				t.Fatal(err)
			}
			if err := <-got; err != nil {
				t.Fatalf("Recv after Reopen: %v; want the new message", err)
			}
		})
	}
}

// openRaw opens stripe 0 of a new generation of k stripes from "b" to a,
// on the data channel.
func openRaw(t *testing.T, tn *testNet, a *Transport, k int) net.Conn {
	t.Helper()
	c, s, err := tn.pair()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	a.Accept("b", s)
	c.Write(wire.AppendHello(nil, wire.Hello{From: "b", Stripes: uint8(k)}))
	return c
}

// TestReopenedTooOften checks that a peer restarting again and again on a
// channel nobody reads evicts its oldest streams instead of being refused:
// the newest streams are the live ones.
func TestReopenedTooOften(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	tn := newTestNet(t)
	a := tn.add(t, "a", nil)
	const sessions = maxGens + 2
	for i := range sessions {
		c, s, err := tn.pair()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a.Accept("b", s)
		c.Write(wire.AppendHello(nil, wire.Hello{From: "b", Channel: uint8(transport.ChanProbe), Stripes: 1}))
		w := wire.NewWriter(c, wire.DefaultMaxFrame)
		if err := w.WriteMessage(wire.Header{Kind: wire.KindProbe, Seq: uint64(i)}, nil); err != nil {
			t.Fatal(err)
		}
		if i < sessions-1 {
			c.Close() // this session of the peer ended
		}
		time.Sleep(20 * time.Millisecond) // registered in order
	}
	// The two oldest were evicted; the others are read in order, each
	// generation giving way to the next at its end.
	for want := uint64(sessions - maxGens); want < sessions; want++ {
		h, _, err := a.Recv(ctx, "b", transport.ChanProbe, nil)
		if err != nil || h.Seq != want {
			t.Fatalf("Recv: seq %d, %v; want seq %d", h.Seq, err, want)
		}
	}
}

// TestOnDrop checks that Config.OnDrop runs once for every drop, both
// Drop and the core's own for malformed input, with the reason, after the
// peer's streams are closed and outside the core's lock; and not for Close.
func TestOnDrop(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	type drop struct {
		peer   transport.PeerID
		reason error
	}
	drops := make(chan drop, 4)
	tn := newTestNet(t)
	var a *Transport
	a = tn.add(t, "a", func(c *Config) {
		c.OnDrop = func(peer transport.PeerID, reason error) {
			// The core's lock must be free: take it from another goroutine,
			// which would wait for this hook to return if the lock were
			// held around it.
			locked := make(chan struct{})
			go func() {
				a.mu.Lock()
				a.mu.Unlock()
				close(locked)
			}()
			select {
			case <-locked:
			case <-time.After(5 * time.Second):
				t.Error("OnDrop runs with the core's lock held")
			}
			drops <- drop{peer, reason}
		}
	})
	expect := func(peer transport.PeerID, reason error) {
		t.Helper()
		select {
		case d := <-drops:
			if d.peer != peer || !errors.Is(d.reason, reason) {
				t.Fatalf("OnDrop(%q, %v), want (%q, %v)", d.peer, d.reason, peer, reason)
			}
		case <-ctx.Done():
			t.Fatalf("OnDrop not called for %q", peer)
		}
	}
	open := func(from string) net.Conn {
		t.Helper()
		c, s, err := tn.pair()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		a.Accept(transport.PeerID(from), s)
		c.Write(wire.AppendHello(nil, wire.Hello{From: from, Stripes: 1}))
		return c
	}

	reason := errors.New("test drop")
	a.Drop("b", reason)
	expect("b", reason)

	// The core's own drop of a peer sending garbage: its stream is closed
	// before the hook runs.
	m := open("m")
	m.Write(bytes.Repeat([]byte{0xff}, wire.FrameHeaderSize))
	if _, _, err := a.Recv(ctx, "m", transport.ChanData, make([]byte, 16)); !errors.Is(err, wire.ErrMalformed) {
		t.Fatalf("Recv of garbage: %v, want ErrMalformed", err)
	}
	expect("m", wire.ErrMalformed)
	m.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := m.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Fatalf("the dropped peer's stream is still open: %v", err)
	}

	// Close drops nobody.
	a.Close()
	a.Drop("c", nil)
	select {
	case d := <-drops:
		t.Fatalf("OnDrop(%q, %v) after Close", d.peer, d.reason)
	case <-time.After(50 * time.Millisecond):
	}
}

// pollRecorder is an accepted stream that records its SetPoll calls.
type pollRecorder struct {
	net.Conn
	mu    sync.Mutex
	polls []time.Duration
}

func (p *pollRecorder) SetPoll(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.polls = append(p.polls, d)
}

func (p *pollRecorder) take() []time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := p.polls
	p.polls = nil
	return out
}

// TestRecvPollsForTheHeader: a Recv under transport.WithPoll sets its
// stream's poll while it waits for the message's header and clears it
// before the payload; a Recv without one leaves the stream alone.
func TestRecvPollsForTheHeader(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tn := newTestNet(t)
	var rec *pollRecorder
	accepted := make(chan struct{}, 1)
	tn.accepted = func(c net.Conn) InStream {
		rec = &pollRecorder{Conn: c}
		accepted <- struct{}{}
		return rec
	}
	a, b := tn.add(t, "a", nil), tn.add(t, "b", nil)
	if err := b.Connect(ctx, "a", "a"); err != nil {
		t.Fatal(err)
	}
	msg := []byte("payload")
	for i, poll := range []time.Duration{7 * time.Microsecond, 0} {
		if err := b.Send(ctx, "a", transport.ChanData, wire.Header{Kind: wire.KindData, Seq: uint64(i)}, msg); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			<-accepted
		}
		rctx := ctx
		if poll > 0 {
			rctx = transport.WithPoll(ctx, poll)
		}
		buf := make([]byte, len(msg))
		if _, _, err := a.Recv(rctx, "b", transport.ChanData, buf); err != nil || !bytes.Equal(buf, msg) {
			t.Fatalf("Recv %d: %q, %v", i, buf, err)
		}
		want := []time.Duration{poll, 0}
		if poll == 0 {
			want = nil
		}
		if got := rec.take(); !slices.Equal(got, want) {
			t.Errorf("Recv with poll %v set the stream's poll to %v, want %v", poll, got, want)
		}
	}
}
