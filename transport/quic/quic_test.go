package quic

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConformance(t *testing.T) {
	transporttest.Run(t, newNodes(nil))
}

func TestConformanceStripes3(t *testing.T) {
	transporttest.Run(t, newNodes(func(c *Config) { c.Stripes = 3 }))
}

// The same contract holds when the nodes, all in this process and network
// namespace, reach each other through shared memory.
func TestConformanceSharedMemory(t *testing.T) {
	transporttest.Run(t, newNodes(func(c *Config) { c.SharedMemory = true }))
}

func TestConformanceSharedMemoryStripes2(t *testing.T) {
	transporttest.Run(t, newNodes(func(c *Config) { c.SharedMemory = true; c.Stripes = 2 }))
}

func TestConfigValidate(t *testing.T) {
	ca := transporttest.NewCA(t)
	id := transporttest.Issue(t, ca, "a")
	good := Config{ID: "a", Identity: id, Listen: "127.0.0.1:0"}
	tests := []struct {
		name   string
		adjust func(*Config)
		want   string // substring of the error; empty means valid
	}{
		{"defaults", func(*Config) {}, ""},
		{"no ID", func(c *Config) { c.ID = "" }, "ID must be 1 to 255 bytes"},
		{"long ID", func(c *Config) { c.ID = transport.PeerID(strings.Repeat("x", 256)) }, "ID must be 1 to 255 bytes"},
		{"no identity", func(c *Config) { c.Identity = nil }, "Identity is required"},
		{"name differs", func(c *Config) { c.ID = "b" }, "differs from ID"},
		{"no listen", func(c *Config) { c.Listen = "" }, "Listen is required"},
		{"stripes", func(c *Config) { c.Stripes = 256 }, "Stripes"},
		{"negative timeout", func(c *Config) { c.IdleTimeout = -time.Second }, "negative"},
		{"windows", func(c *Config) { c.StreamWindow, c.ConnWindow = 8<<20, 1<<20 }, "ConnWindow"},
		{"bad limits", func(c *Config) { c.Limits = wire.Limits{MaxMessage: 10} }, "MaxFrame"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := good
			tt.adjust(&c)
			err := c.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Validate: got %v, want an error containing %q", err, tt.want)
			}
			if _, err := New(c); err == nil {
				t.Fatal("New accepted an invalid config")
			}
		})
	}
	if _, err := New(Config{ID: "a", Identity: id, Listen: "256.0.0.1:1"}); err == nil {
		t.Fatal("New accepted an unusable listen address")
	}
}

// eventually polls cond until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("after %v: %s", d, what)
		}
	}
}

// loggedNode starts a node whose warnings go to the returned buffer.
func loggedNode(t *testing.T, ca *secret.CA, id string) (*Transport, *transporttest.LogBuffer) {
	logs := &transporttest.LogBuffer{}
	tr := newNode(t, ca, id, func(c *Config) {
		c.Logger = zerolog.New(zerolog.MultiLevelWriter(logs, zerolog.NewTestWriter(t))).Level(zerolog.WarnLevel)
	})
	return tr, logs
}

// TestWrongSecretRefused checks that nodes of different clusters cannot
// connect, and that both sides log why.
func TestWrongSecretRefused(t *testing.T) {
	ours, theirs := transporttest.NewCA(t), transporttest.NewCA(t)
	a, aLog := loggedNode(t, ours, "a")
	x, xLog := loggedNode(t, theirs, "x")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	err := x.Connect(ctx, "a", a.Addr())
	if !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("Connect with another secret: got %v, want ErrUnauthenticated", err)
	}
	t.Logf("dialer's error: %v", err)
	if s := xLog.String(); !strings.Contains(s, "refused") || !strings.Contains(s, a.Addr()) {
		t.Errorf("dialer's log does not say it refused %s:\n%s", a.Addr(), s)
	}
	// The dialer rejects the server's certificate first, so the server only
	// sees the handshake fail; it logs that with the dialer's address.
	aLog.Wait(t, "handshake failed", x.Addr())

	// A client that skips verifying the server still cannot get in: its
	// certificate is refused, and the server logs the refusal.
	y := transporttest.Issue(t, theirs, "y")
	tc := y.ClientTLS(ALPN)
	tc.InsecureSkipVerify = true
	conn, err := quicgo.DialAddr(ctx, a.Addr(), tc, nil)
	if err == nil {
		// In TLS 1.3 the client finishes before the server checks its
		// certificate; the refusal then closes the connection.
		select {
		case <-conn.Context().Done():
			err = context.Cause(conn.Context())
		case <-ctx.Done():
			t.Fatal("connection with an untrusted client certificate stayed open")
		}
		_, oerr := conn.AcceptUniStream(ctx)
		if oerr == nil {
			t.Fatal("connection with an untrusted client certificate is usable")
		}
	}
	t.Logf("untrusted client: %v", err)
	aLog.Wait(t, "refused: client certificate not issued by this cluster")

	// And a client with no certificate at all.
	failed := strings.Count(aLog.String(), "handshake failed")
	conn, err = quicgo.DialAddr(ctx, a.Addr(), &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPN}}, nil)
	if err == nil {
		select {
		case <-conn.Context().Done():
		case <-ctx.Done():
			t.Fatal("connection without a client certificate stayed open")
		}
	}
	eventually(t, 5*time.Second, "server did not log the certificate-less client", func() bool {
		return strings.Count(aLog.String(), "handshake failed") > failed
	})
}

// rawPeer is an authenticated peer driven by hand, with a real leaf of the
// cluster, to send what a Transport never would.
type rawPeer struct {
	qt   *quicgo.Transport
	conn *quicgo.Conn
}

func dialRaw(t *testing.T, ctx context.Context, ca *secret.CA, name, addr string) *rawPeer {
	t.Helper()
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	p := &rawPeer{qt: &quicgo.Transport{Conn: udp}}
	t.Cleanup(func() {
		if p.conn != nil {
			p.conn.CloseWithError(0, "")
		}
		p.qt.Close()
		udp.Close()
	})
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	p.conn, err = p.qt.Dial(ctx, ua, transporttest.Issue(t, ca, name).ClientTLS(ALPN), nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// open opens a stream and sends a valid Hello from name on ch.
func (p *rawPeer) open(t *testing.T, ctx context.Context, name string, ch transport.Channel) *quicgo.SendStream {
	t.Helper()
	s, err := p.conn.OpenUniStreamSync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write(wire.AppendHello(nil, wire.Hello{From: name, Channel: uint8(ch), Stripe: 0, Stripes: 1})); err != nil {
		t.Fatal(err)
	}
	return s
}

func frameHeader(f wire.FrameHeader) []byte {
	b := make([]byte, wire.FrameHeaderSize)
	f.Encode(b)
	return b
}

// recvErr runs a Recv from peer and returns its error and how long it took.
func recvErr(ctx context.Context, tr *Transport, peer transport.PeerID, buf []byte) (error, time.Duration) {
	start := time.Now()
	_, _, err := tr.Recv(ctx, peer, transport.ChanData, buf)
	return err, time.Since(start)
}

// TestPeerClosesMidMessage checks that a peer closing its connection in
// the middle of a message fails the Recv at once with a PeerError.
func TestPeerClosesMidMessage(t *testing.T) {
	ca := transporttest.NewCA(t)
	b := newNode(t, ca, "b", nil)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	p := dialRaw(t, ctx, ca, "m", b.Addr())
	s := p.open(t, ctx, "m", transport.ChanData)
	const size = 8 << 20
	s.Write(frameHeader(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: size}, Size: 1 << 20}))
	s.Write(make([]byte, 300<<10))
	go func() {
		time.Sleep(200 * time.Millisecond) // let Recv start reading the message
		p.conn.CloseWithError(0, "bye")
	}()
	err, took := recvErr(ctx, b, "m", make([]byte, size))
	t.Logf("Recv after %v: %v", took, err)
	if peer, ok := transport.PeerOf(err); !ok || peer != "m" || !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("Recv: got %v, want a PeerError for m", err)
	}
	if !errors.Is(err, transport.ErrClosedByPeer) {
		t.Errorf("Recv: %v does not say that the peer, alive, closed the connection", err)
	}
	if took > 2*time.Second {
		t.Errorf("Recv took %v to notice the closed connection", took)
	}
}

// TestPeerVanishes checks that a peer that disappears without closing its
// connection fails the Recv once the idle timeout passes.
func TestPeerVanishes(t *testing.T) {
	ca := transporttest.NewCA(t)
	const idle = time.Second
	b := newNode(t, ca, "b", func(c *Config) { c.IdleTimeout = idle })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	p := dialRaw(t, ctx, ca, "v", b.Addr())
	s := p.open(t, ctx, "v", transport.ChanData)
	s.Write(frameHeader(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 1 << 20}, Size: 1 << 20}))
	s.Write(make([]byte, 100<<10))
	go func() {
		time.Sleep(200 * time.Millisecond)
		p.qt.Close() // drops the connection without a CONNECTION_CLOSE
	}()
	err, took := recvErr(ctx, b, "v", make([]byte, 1<<20))
	t.Logf("Recv after %v: %v", took, err)
	if peer, ok := transport.PeerOf(err); !ok || peer != "v" {
		t.Fatalf("Recv: got %v, want a PeerError for v", err)
	}
	if errors.Is(err, transport.ErrClosedByPeer) {
		t.Errorf("Recv: %v says a vanished peer closed the connection itself", err)
	}
	if took > idle+3*time.Second {
		t.Errorf("Recv took %v to notice a vanished peer with a %v idle timeout", took, idle)
	}
	if n := b.LinkStats().LinkFailures; n != 1 {
		t.Errorf("%d link failures counted for the vanished peer, want 1", n)
	}
}

// TestDropClosesConnections checks that Drop closes the connections the
// dropped peer dialed, so that its sends fail at once.
func TestDropClosesConnections(t *testing.T) {
	nodes := newNodes(nil)(t, 2)
	a, b := nodes[0], nodes[1]
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	transporttest.ConnectAll(t, ctx, nodes)
	if err := a.T.Send(ctx, b.ID, transport.ChanData, wire.Header{Kind: wire.KindData}, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.T.Recv(ctx, a.ID, transport.ChanData, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	b.T.(transport.Dropper).Drop(a.ID, errors.New("test drop"))
	var sendErr error
	eventually(t, 5*time.Second, "sends to the dropping peer still succeed", func() bool {
		sendErr = a.T.Send(ctx, b.ID, transport.ChanData, wire.Header{Kind: wire.KindData}, []byte("x"))
		return errors.Is(sendErr, transport.ErrPeerGone)
	})
	if !errors.Is(sendErr, transport.ErrClosedByPeer) {
		t.Errorf("Send: %v does not say that the peer, alive, dropped this one", sendErr)
	}
	bt := b.T.(*Transport)
	eventually(t, 5*time.Second, "the dropped peer's connections are still open", func() bool {
		bt.mu.Lock()
		defer bt.mu.Unlock()
		return len(bt.inbound) == 0
	})
}

// closedAsDropped reports whether err is the peer closing the connection
// because it dropped us.
func closedAsDropped(err error) bool {
	var ae *quicgo.ApplicationError
	return errors.As(err, &ae) && ae.Remote && ae.ErrorCode == codeDropped
}

// TestHostileDatagrams sends junk to the QUIC port of a node while it
// exchanges messages with a legitimate peer, which must not notice.
func TestHostileDatagrams(t *testing.T) {
	nodes := newNodes(nil)(t, 3)
	a, b, c := nodes[0], nodes[1], nodes[2]
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	transporttest.ConnectAll(t, ctx, nodes[:2])

	junk, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer junk.Close()
	target, _ := net.ResolveUDPAddr("udp", b.Addr)
	var sent atomic.Int64
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			for _, d := range hostileDatagrams(i) {
				if _, err := junk.WriteToUDP(d, target); err == nil {
					sent.Add(1)
				}
			}
			if i%8 == 7 {
				time.Sleep(time.Millisecond)
			}
		}
	}()

	// Exchange messages both ways until a good amount of junk has gone in.
	const junkWanted = 4000
	payload := make([]byte, 64<<10)
	buf := make([]byte, len(payload))
	msgs := 0
	for i := 0; i < 50 || sent.Load() < junkWanted; i++ {
		from, to := a, b
		if i%2 == 1 {
			from, to = b, a
		}
		transporttest.FillPattern(payload, uint64(i))
		done := make(chan error, 1)
		go func() {
			done <- from.T.Send(ctx, to.ID, transport.ChanData, wire.Header{Kind: wire.KindData, Seq: uint64(i)}, payload)
		}()
		h, n, err := to.T.Recv(ctx, from.ID, transport.ChanData, buf)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		if h.Seq != uint64(i) || n != len(payload) {
			t.Fatalf("message %d: seq %d, %d bytes", i, h.Seq, n)
		}
		if err := transporttest.CheckPattern(buf, uint64(i)); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		msgs++
	}
	close(stop)
	<-stopped
	t.Logf("%d junk datagrams sent during %d messages", sent.Load(), msgs)

	// The listener still accepts new peers.
	if err := c.T.Connect(ctx, b.ID, b.Addr); err != nil {
		t.Fatalf("connect after the junk: %v", err)
	}
	if err := c.T.Send(ctx, b.ID, transport.ChanControl, wire.Header{Kind: wire.KindControl}, []byte("hi")); err != nil {
		t.Fatal(err)
	}
	if _, n, err := b.T.Recv(ctx, c.ID, transport.ChanControl, make([]byte, 2)); err != nil || n != 2 {
		t.Fatalf("recv from a new peer after the junk: %d bytes, %v", n, err)
	}
}

// hostileDatagrams returns the junk of round i: random bytes of random
// length, a TLS record carrying a ClientHello, and QUIC Initial long
// headers with garbage inside, for a known and an unknown version.
func hostileDatagrams(i int) [][]byte {
	random := make([]byte, 1+i*37%1500)
	rand.Read(random)

	hello := []byte{0x16, 0x03, 0x01, 0x00, 0xc4, 0x01, 0x00, 0x00, 0xc0, 0x03, 0x03}
	hello = append(hello, make([]byte, 0xc4-6)...)
	rand.Read(hello[11:43])

	initial := make([]byte, 1200)
	rand.Read(initial)
	initial[0] = 0xc0 | initial[0]&0x0f // long header, Initial
	copy(initial[1:5], []byte{0, 0, 0, 1})
	initial[5] = 8 // destination connection ID length

	unknown := make([]byte, 1200)
	rand.Read(unknown)
	unknown[0] |= 0xc0
	copy(unknown[1:5], []byte{0x1a, 0x2a, 0x3a, 0x4a})
	unknown[5] = 8
	return [][]byte{random, hello, initial, unknown}
}

// TestMaliciousPeer checks that an authenticated peer sending frames that
// claim huge lengths, or garbage, gets a typed error, is dropped, and
// cannot make the receiver allocate what it claims.
func TestMaliciousPeer(t *testing.T) {
	junk := make([]byte, wire.FrameHeaderSize)
	rand.Read(junk)
	tests := []struct {
		name string
		send [][]byte
		want error
	}{
		{"message over 4 GiB", [][]byte{
			frameHeader(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 1<<32 + 1<<20}, Size: 1 << 20}),
		}, wire.ErrTooLarge},
		{"frame over limit", [][]byte{
			frameHeader(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 1 << 31}, Size: 1 << 31}),
		}, wire.ErrTooLarge},
		{"4 GiB message then garbage", [][]byte{
			frameHeader(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: wire.DefaultMaxMessage}, Size: 64 << 10}),
			make([]byte, 64<<10),
			junk,
		}, wire.ErrMalformed},
		{"garbage header", [][]byte{junk}, wire.ErrMalformed},
	}
	ca := transporttest.NewCA(t)
	b := newNode(t, ca, "b", nil)
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			name := "mallory-" + string(rune('a'+i))
			before := transporttest.HeapObjectsBytes()
			p := dialRaw(t, ctx, ca, name, b.Addr())
			s := p.open(t, ctx, name, transport.ChanData)
			for _, d := range tt.send {
				s.Write(d)
			}
			err, took := recvErr(ctx, b, transport.PeerID(name), make([]byte, 4096))
			t.Logf("Recv after %v: %v", took, err)
			if peer, ok := transport.PeerOf(err); !ok || peer != transport.PeerID(name) || !errors.Is(err, tt.want) {
				t.Fatalf("Recv: got %v, want a PeerError for %s wrapping %v", err, name, tt.want)
			}
			select {
			case <-p.conn.Context().Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the malicious peer's connection is still open")
			}
			if err := context.Cause(p.conn.Context()); !closedAsDropped(err) {
				t.Fatalf("the malicious peer's connection ended with %v, want a close for code %d", err, codeDropped)
			}
			if grew := int64(transporttest.HeapObjectsBytes()) - int64(before); grew >= int64(wire.DefaultMaxFrame) {
				t.Errorf("heap grew by %d bytes, frame limit is %d", grew, wire.DefaultMaxFrame)
			} else {
				t.Logf("heap grew by %d bytes", grew)
			}
		})
	}
}

// TestCloseLeavesNoGoroutines checks that a used and closed transport
// leaves no goroutine behind.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	ca := transporttest.NewCA(t)
	nodes := make([]transporttest.Node, 2)
	for i, id := range []string{"a", "b"} {
		tr, err := New(Config{ID: transport.PeerID(id), Identity: transporttest.Issue(t, ca, id), Listen: "127.0.0.1:0", Stripes: 2})
		if err != nil {
			t.Fatal(err)
		}
		nodes[i] = transporttest.Node{ID: transport.PeerID(id), T: tr, Addr: tr.Addr()}
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	transporttest.ConnectAll(t, ctx, nodes)
	p := make([]byte, 1<<20)
	for _, dir := range [][2]int{{0, 1}, {1, 0}} {
		from, to := nodes[dir[0]], nodes[dir[1]]
		done := make(chan error, 1)
		go func() { done <- from.T.Send(ctx, to.ID, transport.ChanData, wire.Header{Kind: wire.KindData}, p) }()
		if _, _, err := to.T.Recv(ctx, from.ID, transport.ChanData, make([]byte, len(p))); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		if err := n.T.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	goleak.VerifyNone(t, ignore)
}

// TestRestartResetsStaleConnections checks Config.ResetKey: a node that
// crashes and restarts at the same address with the same key answers its
// peer's next data on the stale connection with a stateless reset, so the
// peer's Send fails at once rather than after the idle timeout. With a
// fresh random key the stale connection lingers, which shows the key is
// what makes the difference.
func TestRestartResetsStaleConnections(t *testing.T) {
	const idle = 30 * time.Second // far beyond the bounds below
	for _, tc := range []struct {
		name    string
		sameKey bool
	}{
		{"same key", true},
		{"random key", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			var key [32]byte
			rand.Read(key[:])
			ca := transporttest.NewCA(t)
			withKey := func(k *[32]byte) func(*Config) {
				return func(c *Config) { c.IdleTimeout, c.ResetKey = idle, k }
			}
			b := newNode(t, ca, "b", withKey(&key))
			addr := b.Addr()
			a := newNode(t, ca, "a", withKey(nil))
			if err := a.Connect(ctx, "b", addr); err != nil {
				t.Fatal(err)
			}
			payload := make([]byte, 1024) // a packet big enough to be answered with a reset
			send := func() error {
				// Unacknowledged data soon fills the congestion window and
				// blocks a Send on a connection that lingers; that is not
				// the failure looked for, so each Send gets a short while.
				sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				defer cancel()
				return a.Send(sctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData}, payload)
			}
			if err := send(); err != nil {
				t.Fatal(err)
			}
			if _, _, err := b.Recv(ctx, "a", transport.ChanData, make([]byte, len(payload))); err != nil {
				t.Fatal(err)
			}

			// Crash: the socket goes first, so no CONNECTION_CLOSE leaves.
			b.udp.Close()
			b.Close()
			restartKey := &key
			if !tc.sameKey {
				restartKey = nil
			}
			b2 := newNode(t, ca, "b", func(c *Config) {
				withKey(restartKey)(c)
				c.Listen = addr
			})

			const bound = time.Second
			start := time.Now()
			var err error
			for time.Since(start) < bound {
				if err = send(); errors.Is(err, transport.ErrPeerGone) {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			took := time.Since(start)
			if !tc.sameKey {
				if errors.Is(err, transport.ErrPeerGone) {
					t.Fatalf("Send on the stale connection failed after %v with a random reset key: %v", took, err)
				}
				t.Logf("after %v the stale connection is still up (last Send: %v)", took, err)
				return
			}
			t.Logf("Send failed after %v: %v", took, err)
			if !errors.Is(err, transport.ErrPeerGone) {
				t.Fatalf("Send on the stale connection: got %v after %v, want ErrPeerGone well within the %v idle timeout", err, took, idle)
			}
			var reset *quicgo.StatelessResetError
			if !errors.As(err, &reset) {
				t.Errorf("Send failed with %v, want a stateless reset", err)
			}
			// The failed Send dropped the stale link, so Connect dials the
			// restarted peer afresh and traffic flows again.
			if err := a.Connect(ctx, "b", addr); err != nil {
				t.Fatalf("Connect to the restarted peer: %v", err)
			}
			if err := send(); err != nil {
				t.Fatalf("Send to the restarted peer: %v", err)
			}
			if _, _, err := b2.Recv(ctx, "a", transport.ChanData, make([]byte, len(payload))); err != nil {
				t.Fatalf("restarted peer's Recv: %v", err)
			}
		})
	}
}

// TestRefusalsReported: a worker of another cluster that dials is listed
// by the accepting side's Refusals, with its listening address, since over
// QUIC one socket serves both; its own Connect says why.
func TestRefusalsReported(t *testing.T) {
	a, _ := loggedNode(t, transporttest.NewCA(t), "a")
	x, _ := loggedNode(t, transporttest.NewCA(t), "x")
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := x.Connect(ctx, "a", a.Addr()); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("Connect with another secret: got %v, want ErrUnauthenticated", err)
	}
	var refs []transport.Refusal
	for deadline := time.Now().Add(5 * time.Second); len(refs) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		refs = a.Refusals()
	}
	if len(refs) != 1 || refs[0].Remote != x.Addr() || !errors.Is(refs[0].Err, transport.ErrUnauthenticated) {
		t.Fatalf("Refusals = %+v, want one naming %s", refs, x.Addr())
	}
	if got := x.Refusals(); len(got) != 0 {
		t.Fatalf("the dialer lists refusals of its own: %+v", got)
	}
}

// TestHandshakeFloodIsBounded: a burst of handshakes presenting another
// cluster's certificate is refused without delaying a legitimate peer's
// heartbeat-sized messages, and writes a handful of log lines, the rest
// summed up.
func TestHandshakeFloodIsBounded(t *testing.T) {
	ours, theirs := transporttest.NewCA(t), transporttest.NewCA(t)
	logs := &transporttest.LogBuffer{}
	a := newNode(t, ours, "a", func(c *Config) {
		c.Logger = zerolog.New(logs).Level(zerolog.WarnLevel)
		c.logEveryRefusal = false
	})
	b := newNode(t, ours, "b", nil)
	// c and d exchange the same heartbeats away from the flood: the
	// delays that load and the dialers' own handshakes, computed in this
	// process, cause every pair alike.
	c := newNode(t, ours, "c", nil)
	d := newNode(t, ours, "d", nil)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if err := b.Connect(ctx, "a", a.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := d.Connect(ctx, "c", c.Addr()); err != nil {
		t.Fatal(err)
	}
	beating, stop := context.WithCancel(ctx)
	flooded := heartbeats(beating, b, a)
	control := heartbeats(beating, d, c)
	start := time.Now()

	// 32 dialers at once: past maxHandshakes/2 under way, clients must
	// prove their address with a Retry first.
	intruder := transporttest.Issue(t, theirs, "intruder").ClientTLS(ALPN)
	intruder.InsecureSkipVerify = true
	const dialers, each = 32, 5
	var wg sync.WaitGroup
	for range dialers {
		wg.Go(func() {
			for range each {
				dctx, dcancel := context.WithTimeout(ctx, 3*time.Second)
				if conn, err := quicgo.DialAddr(dctx, a.Addr(), intruder, nil); err == nil {
					select {
					case <-conn.Context().Done():
					case <-dctx.Done():
					}
					conn.CloseWithError(0, "")
				}
				dcancel()
			}
		})
	}
	wg.Wait()
	stop()
	got, want := <-flooded, <-control
	if got.err != nil {
		t.Fatalf("the legitimate peer's messages during the flood: %v", got.err)
	}
	if want.err != nil {
		t.Fatalf("the other pair's messages during the flood: %v", want.err)
	}
	t.Logf("longest gap between legitimate messages during %d handshakes: %v (%v between the other pair's)", dialers*each, got.longest, want.longest)
	// On a loaded machine both gaps grow, and alike: 0.4 to 0.9 s with
	// another process busy on one of two cores. A stall of the flooded
	// transport shows as a gap of its own.
	if limit := max(time.Second, 2*want.longest); got.longest > limit {
		t.Fatalf("a legitimate message waited %v during the flood, over %v (the other pair's longest wait was %v)", got.longest, limit, want.longest)
	}
	a.Close()
	// At most floodlog.DefaultTotal lines and a summary per window.
	windows := int(time.Since(start)/floodlog.DefaultWindow) + 1
	log := logs.String()
	if n := strings.Count(log, `"level":"warn"`); n > windows*(floodlog.DefaultTotal+1) {
		t.Fatalf("%d warnings for a flood of %d handshakes in %d windows of %v:\n%s", n, dialers*each, windows, floodlog.DefaultWindow, log)
	}
	if !strings.Contains(log, "refused: client certificate not issued by this cluster") || !strings.Contains(log, "without logging each") {
		t.Fatalf("the log does not show the refusals and their summary:\n%s", log)
	}
}

// gaps is what heartbeats saw: the longest wait between two arrivals, or
// why a receive failed.
type gaps struct {
	longest time.Duration
	err     error
}

// heartbeats has from send to a small message every 50 ms, as heartbeats
// go, until ctx ends, and then reports the longest gap between arrivals.
func heartbeats(ctx context.Context, from, to *Transport) <-chan gaps {
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
			from.Send(ctx, to.cfg.ID, transport.ChanLiveness, wire.Header{Kind: wire.KindControl}, nil)
		}
	}()
	res := make(chan gaps, 1)
	go func() {
		var g gaps
		last := time.Now()
		for {
			rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
			_, _, err := to.Recv(rctx, from.cfg.ID, transport.ChanLiveness, nil)
			rcancel()
			if ctx.Err() != nil {
				res <- g
				return
			}
			if err != nil {
				g.err = err
				res <- g
				return
			}
			g.longest = max(g.longest, time.Since(last))
			last = time.Now()
		}
	}()
	return res
}

// TestSetStripes: a channel set to 4 stripes at run time dials the 3
// connections Connect did not, when a large message first needs them, and
// the message arrives intact over them.
func TestSetStripes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca := transporttest.NewCA(t)
	a, b := newNode(t, ca, "a", nil), newNode(t, ca, "b", nil)
	if err := a.SetStripes(transport.ChanData, 256); err == nil {
		t.Fatal("SetStripes(data, 256) accepted")
	}
	if err := a.SetStripes(transport.ChanData, 4); err != nil || a.Stripes(transport.ChanData) != 4 {
		t.Fatalf("SetStripes(data, 4): %v; Stripes = %d", err, a.Stripes(transport.ChanData))
	}
	if err := a.Connect(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}
	if n := a.core.LinkCount("b"); n != 1 {
		t.Fatalf("Connect dialed %d connections, want Config.Stripes 1", n)
	}
	msg := make([]byte, 3<<20+7)
	transporttest.FillPattern(msg, 7)
	sent := make(chan error, 1)
	go func() { sent <- a.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData, Seq: 1}, msg) }()
	buf := make([]byte, len(msg))
	h, n, err := b.Recv(ctx, "a", transport.ChanData, buf)
	if err != nil || h.Seq != 1 || n != len(msg) {
		t.Fatalf("Recv: seq %d, %d bytes, %v; want seq 1 of %d", h.Seq, n, err, len(msg))
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	if err := transporttest.CheckPattern(buf, 7); err != nil {
		t.Fatal(err)
	}
	// b accepted every stripe, so it holds every connection they came on.
	b.mu.Lock()
	inbound := 0
	for _, p := range b.inbound {
		if p == "a" {
			inbound++
		}
	}
	b.mu.Unlock()
	if inbound != 4 || a.core.LinkCount("b") != 4 {
		t.Fatalf("b holds %d connections from a, a %d links to b; want 4 and 4", inbound, a.core.LinkCount("b"))
	}
	if s := a.LinkStats(); s.Connects != 1 || s.DialErrors != 0 || s.LinkFailures != 0 {
		t.Fatalf("LinkStats %+v, want one connect and no errors", s)
	}
}
