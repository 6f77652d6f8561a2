package tcp

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

func TestConformanceTLS(t *testing.T) {
	transporttest.Run(t, newNodes(false, nil))
}

func TestConformanceInsecure(t *testing.T) {
	transporttest.Run(t, newNodes(true, nil))
}

func TestConformanceStripes3(t *testing.T) {
	transporttest.Run(t, newNodes(false, func(c *Config) { c.Stripes = 3 }))
}

// The same contract holds when the nodes, all in this process and network
// namespace, reach each other through shared memory.
func TestConformanceSharedMemory(t *testing.T) {
	transporttest.Run(t, newNodes(false, func(c *Config) { c.SharedMemory = true }))
}

func TestConformanceSharedMemoryInsecure(t *testing.T) {
	transporttest.Run(t, newNodes(true, func(c *Config) { c.SharedMemory = true }))
}

func TestConfigValidate(t *testing.T) {
	ca := transporttest.NewCA(t)
	id := transporttest.Issue(t, ca, "a")
	for name, tc := range map[string]struct {
		cfg  Config
		want string // substring of the error, "" for none
	}{
		"ok":            {Config{ID: "a", Identity: id, Listen: "127.0.0.1:0"}, ""},
		"insecure":      {Config{ID: "a", Insecure: true, Listen: "127.0.0.1:0"}, ""},
		"no id":         {Config{Identity: id, Listen: "127.0.0.1:0"}, "ID"},
		"no identity":   {Config{ID: "a", Listen: "127.0.0.1:0"}, "Identity is required"},
		"other name":    {Config{ID: "b", Identity: id, Listen: "127.0.0.1:0"}, "differs"},
		"no listen":     {Config{ID: "a", Identity: id}, "Listen"},
		"stripes":       {Config{ID: "a", Identity: id, Listen: "127.0.0.1:0", Stripes: 256}, "Stripes"},
		"bad limits":    {Config{ID: "a", Identity: id, Listen: "127.0.0.1:0", Limits: wire.Limits{MaxFrame: 1}}, "MaxMessage"},
		"neg handshake": {Config{ID: "a", Identity: id, Listen: "127.0.0.1:0", HandshakeTimeout: -1}, "HandshakeTimeout"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" && err != nil {
				t.Fatalf("Validate: %v", err)
			}
			if tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate = %v, want an error about %q", err, tc.want)
			}
		})
	}
}

func testContext(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// logTo sends a node's log to buf as JSON, for assertions.
func logTo(buf *transporttest.LogBuffer) func(*Config) {
	return func(c *Config) { c.Logger = zerolog.New(buf) }
}

func TestWrongSecretRefused(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	var serverLog transporttest.LogBuffer
	ca := transporttest.NewCA(t)
	a := newNode(t, ca, "a", logTo(&serverLog))

	t.Run("other secret", func(t *testing.T) {
		b := newNode(t, transporttest.NewCA(t), "b", nil)
		err := b.Connect(ctx, "a", a.Addr())
		if !errors.Is(err, transport.ErrUnauthenticated) {
			t.Fatalf("Connect with another secret: %v, want ErrUnauthenticated", err)
		}
		// The client refuses the server's chain first and aborts with an
		// alert, which the server logs with the client's address.
		serverLog.Wait(t, "refused", "bad certificate")
		// The other way round the server (b) refuses our certificate.
		if err := a.Connect(ctx, "b", b.Addr()); !errors.Is(err, transport.ErrUnauthenticated) {
			t.Fatalf("Connect to a node with another secret: %v, want ErrUnauthenticated", err)
		}
	})

	t.Run("no certificate", func(t *testing.T) {
		c := newNode(t, ca, "c", nil)
		c.clientTLS = &tls.Config{
			MinVersion:         tls.VersionTLS13,
			InsecureSkipVerify: true, // the server is fine; we present nothing
			NextProtos:         []string{ALPN},
		}
		err := c.Connect(ctx, "a", a.Addr())
		if !errors.Is(err, transport.ErrUnauthenticated) {
			t.Fatalf("Connect without a certificate: %v, want ErrUnauthenticated", err)
		}
		serverLog.Wait(t, "didn't provide a certificate")
	})

	t.Run("other secret, not checking the server", func(t *testing.T) {
		// The server's own certificate check refuses the client, and says
		// why.
		g := newNode(t, ca, "g", nil)
		g.clientTLS = transporttest.Issue(t, transporttest.NewCA(t), "g").ClientTLS(ALPN)
		g.clientTLS.InsecureSkipVerify = true
		g.clientTLS.RootCAs = nil
		err := g.Connect(ctx, "a", a.Addr())
		if !errors.Is(err, transport.ErrUnauthenticated) {
			t.Fatalf("Connect with another secret: %v, want ErrUnauthenticated", err)
		}
		serverLog.Wait(t, "refused: client certificate not issued by this cluster", "signed by unknown authority")
	})

	t.Run("insecure client", func(t *testing.T) {
		d := newNode(t, nil, "d", nil)
		err := d.Connect(ctx, "a", a.Addr())
		if !errors.Is(err, transport.ErrUnauthenticated) {
			t.Fatalf("insecure Connect to a TLS node: %v, want ErrUnauthenticated", err)
		}
		serverLog.Wait(t, "insecure client")
	})

	t.Run("wrong peer", func(t *testing.T) {
		e := newNode(t, ca, "e", nil)
		err := e.Connect(ctx, "somebody-else", a.Addr())
		if !errors.Is(err, transport.ErrUnauthenticated) || !strings.Contains(err.Error(), `"a"`) {
			t.Fatalf("Connect to a at a wrong name: %v, want ErrUnauthenticated naming a", err)
		}
	})

	// The refusals did not disturb a legitimate peer.
	f := newNode(t, ca, "f", nil)
	exchange(t, ctx, f, a, "f", "a", 3, 1000)
}

// exchange sends count messages of size bytes from src to dst and checks
// them.
func exchange(t *testing.T, ctx context.Context, src, dst *Transport, srcID, dstID transport.PeerID, count, size int) {
	t.Helper()
	if err := src.Connect(ctx, dstID, dst.Addr()); err != nil {
		t.Fatalf("connect: %v", err)
	}
	if err := exchangeErr(ctx, src, dst, srcID, dstID, count, size, 1); err != nil {
		t.Fatal(err)
	}
}

func exchangeErr(ctx context.Context, src, dst *Transport, srcID, dstID transport.PeerID, count, size int, seed uint64) error {
	sent := make(chan error, 1)
	go func() {
		p := make([]byte, size)
		for i := range count {
			transporttest.FillPattern(p, seed+uint64(i))
			if err := src.Send(ctx, dstID, transport.ChanData, wire.Header{Kind: wire.KindData, Seq: uint64(i)}, p); err != nil {
				sent <- fmt.Errorf("send %d: %w", i, err)
				return
			}
		}
		sent <- nil
	}()
	buf := make([]byte, size)
	for i := range count {
		h, n, err := dst.Recv(ctx, srcID, transport.ChanData, buf)
		if err != nil {
			return fmt.Errorf("recv %d: %w", i, err)
		}
		if n != size || h.Seq != uint64(i) {
			return fmt.Errorf("recv %d: %d bytes, seq %d", i, n, h.Seq)
		}
		if err := transporttest.CheckPattern(buf[:n], seed+uint64(i)); err != nil {
			return fmt.Errorf("recv %d: %w", i, err)
		}
	}
	return <-sent
}

// rawPeer is a hand-driven client holding a real leaf of the cluster: it
// passes authentication and then sends whatever a test wants.
type rawPeer struct {
	conn *tls.Conn
}

func dialRaw(t *testing.T, id *secret.Identity, addr string) *rawPeer {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := tls.DialWithDialer(&d, "tcp", addr, id.ClientTLS(ALPN))
	if err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := readAck(c); err != nil {
		t.Fatalf("raw dial: %v", err)
	}
	return &rawPeer{conn: c}
}

func (r *rawPeer) write(t *testing.T, b []byte) {
	t.Helper()
	if _, err := r.conn.Write(b); err != nil {
		t.Fatalf("raw write: %v", err)
	}
}

func (r *rawPeer) hello(t *testing.T, from string, ch transport.Channel) {
	r.write(t, wire.AppendHello(nil, wire.Hello{From: from, Channel: uint8(ch), Stripes: 1}))
}

func frame(f wire.FrameHeader) []byte {
	b := make([]byte, wire.FrameHeaderSize)
	f.Encode(b)
	return b
}

// closedByPeer waits for the server to close the raw connection.
func (r *rawPeer) closedByPeer(t *testing.T) {
	t.Helper()
	r.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	var b [1]byte
	if _, err := r.conn.Read(b[:]); err == nil || isTimeout(err) {
		t.Fatalf("server kept the connection open (read: %v)", err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestPeerClosesMidMessage(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	ca := transporttest.NewCA(t)
	a := newNode(t, ca, "a", nil)
	raw := dialRaw(t, transporttest.Issue(t, ca, "raw"), a.Addr())
	raw.hello(t, "raw", transport.ChanData)
	// A 3 MiB message is three frames; send the first and half the second.
	const size = 3 << 20
	f := wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: size}, Size: wire.DefaultMaxFrame}
	raw.write(t, frame(f))
	raw.write(t, make([]byte, wire.DefaultMaxFrame))
	f.Offset = wire.DefaultMaxFrame
	raw.write(t, frame(f))
	raw.write(t, make([]byte, wire.DefaultMaxFrame/2))

	const deadline = 20 * time.Second
	rctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	got := make(chan error, 1)
	go func() {
		_, _, err := a.Recv(rctx, "raw", transport.ChanData, make([]byte, size))
		got <- err
	}()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	raw.conn.Close()
	err := <-got
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Recv returned %v after the peer closed, want well within its %v deadline", d, deadline)
	}
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Peer != "raw" || !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("Recv: %v, want a PeerError from raw wrapping io.ErrUnexpectedEOF", err)
	}
	// Later Recvs on the channel fail at once too.
	if _, _, err := a.Recv(rctx, "raw", transport.ChanData, nil); !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("Recv after the peer closed: %v, want ErrPeerGone", err)
	}
	if n := a.LinkStats().LinkFailures; n != 1 {
		t.Errorf("%d link failures counted for a peer gone mid-message, want 1", n)
	}
}

func TestCancelMidMessageBreaksStream(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	ca := transporttest.NewCA(t)
	a := newNode(t, ca, "a", nil)
	raw := dialRaw(t, transporttest.Issue(t, ca, "raw"), a.Addr())
	raw.hello(t, "raw", transport.ChanData)
	f := wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 100}, Size: 100}
	raw.write(t, frame(f))
	raw.write(t, make([]byte, 40)) // 60 bytes short

	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, _, err := a.Recv(cctx, "raw", transport.ChanData, make([]byte, 100)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Recv cancelled mid-message: %v, want DeadlineExceeded", err)
	}
	start := time.Now()
	_, _, err := a.Recv(ctx, "raw", transport.ChanData, make([]byte, 100))
	if !errors.Is(err, transport.ErrPeerGone) || time.Since(start) > time.Second {
		t.Fatalf("Recv after a cancel mid-message: %v after %v, want a prompt PeerError", err, time.Since(start))
	}
	raw.closedByPeer(t)
}

// keepExchanging exchanges messages between a and b, both ways, until the
// function it returns is called; that returns the first failure, or an
// error if no round completed.
func keepExchanging(ctx context.Context, a, b *Transport) (stop func() error) {
	done := make(chan struct{})
	traffic := make(chan error, 1)
	go func() {
		rounds := 0
		for {
			select {
			case <-done:
				if rounds == 0 {
					traffic <- errors.New("no round completed")
					return
				}
				traffic <- nil
				return
			default:
			}
			if err := exchangeErr(ctx, b, a, "b", "a", 4, 4096, uint64(rounds)); err != nil {
				traffic <- fmt.Errorf("round %d b→a: %w", rounds, err)
				return
			}
			if err := exchangeErr(ctx, a, b, "a", "b", 1, 1<<20, uint64(rounds)); err != nil {
				traffic <- fmt.Errorf("round %d a→b: %w", rounds, err)
				return
			}
			rounds++
		}
	}()
	return func() error {
		close(done)
		return <-traffic
	}
}

func TestHostileConnections(t *testing.T) {
	ctx := testContext(t, 60*time.Second)
	ca := transporttest.NewCA(t)
	var serverLog transporttest.LogBuffer
	const handshake = time.Second
	a := newNode(t, ca, "a", func(c *Config) {
		c.HandshakeTimeout = handshake
		c.Logger = zerolog.New(&serverLog)
	})
	b := newNode(t, ca, "b", nil)
	if err := b.Connect(ctx, "a", a.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}

	// Legitimate traffic both ways for the whole test.
	stopTraffic := keepExchanging(ctx, a, b)

	dial := func() net.Conn {
		c, err := net.DialTimeout("tcp", a.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// Random bytes.
	for range 10 {
		c := dial()
		junk := make([]byte, 64<<10)
		rand.Read(junk)
		c.Write(junk)
		c.Close()
	}
	// A TLS record header announcing a huge record, then junk.
	c := dial()
	c.Write([]byte{0x16, 0x03, 0x01, 0xff, 0xff})
	c.Write(make([]byte, 1000))
	// A real ClientHello from a client with no certificate, then silence.
	hello := dial()
	go tls.Client(hello, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{ALPN}}).Handshake()
	// Silent half-open connections, dropped after the handshake timeout.
	var silents []net.Conn
	for range 5 {
		silents = append(silents, dial())
	}
	for _, s := range silents {
		s.SetReadDeadline(time.Now().Add(handshake + 5*time.Second))
		if _, err := s.Read(make([]byte, 1)); err == nil || isTimeout(err) {
			t.Fatalf("silent connection not closed after the handshake timeout: %v", err)
		}
	}
	if err := stopTraffic(); err != nil {
		t.Fatalf("legitimate traffic during the attack: %v", err)
	}
	serverLog.Wait(t, "refused: TLS handshake failed", "first record does not look like a TLS handshake", "i/o timeout")
}

// TestSilentConnectionCost checks that connections that never send a byte
// cost a small fixed amount of heap each while they wait for the handshake
// timeout.
func TestSilentConnectionCost(t *testing.T) {
	a := newNode(t, transporttest.NewCA(t), "a", nil)
	before := transporttest.HeapObjectsBytes()
	const silent = 100
	for range silent {
		c, err := net.DialTimeout("tcp", a.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	time.Sleep(300 * time.Millisecond) // let the server accept them all
	perConn := (int64(transporttest.HeapObjectsBytes()) - int64(before)) / silent
	t.Logf("heap per silent connection: %d bytes", perConn)
	if perConn > 16<<10 {
		t.Errorf("a silent connection costs %d bytes of heap, want a small fixed amount", perConn)
	}
}

func TestMaliciousPeer(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	ca := transporttest.NewCA(t)
	var serverLog transporttest.LogBuffer
	a := newNode(t, ca, "a", logTo(&serverLog))
	buf := make([]byte, 64<<10)

	randomHeader := func() []byte {
		b := make([]byte, wire.FrameHeaderSize)
		rand.Read(b)
		return b
	}
	validStartJunk := func() []byte { // magic and version right, fields random
		b := randomHeader()
		b[0], b[1], b[2] = 'G', 'Y', wire.Version
		b[3] = 200 // unknown kind
		return b
	}
	cases := []struct {
		name  string
		input [][]byte
		want  error
	}{
		{"4 GiB message", [][]byte{frame(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 1 << 32}, Size: 1 << 20})}, wire.ErrTooLarge},
		{"4 GiB frame", [][]byte{frame(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 1<<32 - 1}, Size: 1<<32 - 1})}, wire.ErrTooLarge},
		{"random header", [][]byte{randomHeader()}, wire.ErrMalformed},
		{"random fields", [][]byte{validStartJunk()}, wire.ErrMalformed},
		{"stray frame after a message", [][]byte{
			frame(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 2 << 20}, Size: 1 << 20}),
			make([]byte, 1<<20),
			frame(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 2 << 20}, Offset: 7, Size: 1 << 20}),
		}, wire.ErrMalformed},
		// Within the limits: a 4 GiB message too long for buf is skipped
		// through a fixed scratch buffer until the peer hangs up.
		{"4 GiB message then hang up", [][]byte{
			frame(wire.FrameHeader{Header: wire.Header{Kind: wire.KindData, Len: 1<<32 - 1}, Size: 1 << 20}),
			make([]byte, 1<<19),
		}, io.ErrUnexpectedEOF},
	}
	before := transporttest.HeapObjectsBytes()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A name per case: a dropped peer's later Recvs fail until it
			// has opened new streams, which would race with this case.
			name := transport.PeerID(fmt.Sprintf("evil-%d", i))
			raw := dialRaw(t, transporttest.Issue(t, ca, string(name)), a.Addr())
			raw.hello(t, string(name), transport.ChanData)
			for _, b := range tc.input {
				raw.write(t, b)
			}
			if tc.want == io.ErrUnexpectedEOF {
				time.Sleep(50 * time.Millisecond)
				raw.conn.Close()
			}
			_, _, err := a.Recv(ctx, name, transport.ChanData, buf)
			var pe *transport.PeerError
			if !errors.As(err, &pe) || pe.Peer != name || !errors.Is(err, tc.want) {
				t.Fatalf("Recv: %v, want a PeerError from %s wrapping %v", err, name, tc.want)
			}
			if tc.want != io.ErrUnexpectedEOF {
				raw.closedByPeer(t) // dropped
				serverLog.Wait(t, "dropped peer")
			}
			if grown := int64(transporttest.HeapObjectsBytes()) - int64(before); grown >= wire.DefaultMaxFrame {
				t.Fatalf("heap grew by %d bytes, want less than the frame limit %d", grown, wire.DefaultMaxFrame)
			}
		})
	}
	// A hello naming someone else than the certificate is refused.
	raw := dialRaw(t, transporttest.Issue(t, ca, "evil"), a.Addr())
	raw.hello(t, "a-victim", transport.ChanData)
	raw.closedByPeer(t)
	serverLog.Wait(t, "certificate names", "a-victim")
}

func TestDropAndReopen(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	ca := transporttest.NewCA(t)
	a, b := newNode(t, ca, "a", nil), newNode(t, ca, "b", nil)
	exchange(t, ctx, b, a, "b", "a", 2, 100)

	pending := make(chan error, 1)
	go func() {
		_, _, err := a.Recv(ctx, "b", transport.ChanData, make([]byte, 100))
		pending <- err
	}()
	time.Sleep(50 * time.Millisecond)
	reason := errors.New("test drop")
	start := time.Now()
	a.Drop("b", reason)
	err := <-pending
	if !errors.Is(err, reason) || !errors.Is(err, transport.ErrPeerGone) || time.Since(start) > time.Second {
		t.Fatalf("Recv pending at Drop: %v after %v, want a prompt PeerError wrapping the reason", err, time.Since(start))
	}
	if err := a.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData}, nil); !errors.Is(err, transport.ErrNotConnected) {
		t.Fatalf("Send after Drop: %v, want ErrNotConnected", err)
	}
	// b's stream to a was closed by the drop: its next Send fails with a
	// PeerError, which drops a at b too, or, if the close has not reached
	// it yet, its message is lost. Either way b connects again (a no-op
	// while its link stands) and its new streams reach a.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := b.Connect(ctx, "a", a.Addr()); err != nil {
			t.Fatalf("b reconnecting to a: %v", err)
		}
		err := exchangeErr(ctx, b, a, "b", "a", 1, 100, 7)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b never got through to a again after the drop: %v", err)
		}
		if !errors.Is(err, transport.ErrPeerGone) {
			t.Fatalf("exchange after drop: %v, want success or ErrPeerGone", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestCloseLeavesNoGoroutines(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := testContext(t, 30*time.Second)
	ca := transporttest.NewCA(t)
	var ts []*Transport
	for _, id := range []string{"a", "b"} {
		cfg := Config{ID: transport.PeerID(id), Identity: transporttest.Issue(t, ca, id), Listen: "127.0.0.1:0", Stripes: 2}
		tr, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tr)
	}
	a, b := ts[0], ts[1]
	if err := b.Connect(ctx, "a", a.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := exchangeErr(ctx, b, a, "b", "a", 2, 1<<20, 1); err != nil { // striped
		t.Fatal(err)
	}
	// A half-open connection and a pending Recv at close.
	c, err := net.Dial("tcp", a.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pending := make(chan error, 1)
	go func() {
		_, _, err := a.Recv(ctx, "b", transport.ChanControl, nil)
		pending <- err
	}()
	time.Sleep(50 * time.Millisecond)
	for _, tr := range ts {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	if err := <-pending; !errors.Is(err, transport.ErrClosed) {
		t.Errorf("Recv pending at Close: %v, want ErrClosed", err)
	}
}

// TestSteadyStateAllocs checks that Send and Recv allocate nothing per
// message once the streams are open, with a cancellable context (whose
// watching is the usual source of per-call allocations), striped or not.
// Over TLS, crypto/tls itself allocates one small object per record it
// reads (its atLeastReader escapes), so there the bound is the record
// count.
func TestSteadyStateAllocs(t *testing.T) {
	for _, tc := range []struct {
		name     string
		insecure bool
		stripes  int
		size     int
	}{
		{"insecure/4KiB", true, 1, 4 << 10},
		{"insecure/1MiB-striped", true, 2, 1 << 20},
		{"tls/4KiB", false, 1, 4 << 10},
		{"tls/1MiB-striped", false, 2, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			nodes := newNodes(tc.insecure, func(c *Config) { c.Stripes = tc.stripes })(t, 2)
			a, b := nodes[0].T, nodes[1].T
			transporttest.ConnectAll(t, ctx, nodes)
			payload, buf, echo := make([]byte, tc.size), make([]byte, tc.size), make([]byte, tc.size)
			hdr := wire.Header{Kind: wire.KindBench}
			// The receives poll, as small collectives' do: a polled read
			// must not allocate either.
			polled := transport.WithPoll(ctx, 50*time.Microsecond)
			const runs = 50
			echoed := make(chan error, 1)
			go func() {
				for range runs + 1 { // AllocsPerRun runs once more to warm up
					h, n, err := b.Recv(polled, "node-0", transport.ChanData, echo)
					if err == nil {
						err = b.Send(ctx, "node-0", transport.ChanData, h, echo[:n])
					}
					if err != nil {
						echoed <- err
						return
					}
				}
				echoed <- nil
			}()
			allocs := testing.AllocsPerRun(runs, func() {
				if err := a.Send(ctx, "node-1", transport.ChanData, hdr, payload); err != nil {
					t.Fatal(err)
				}
				if _, _, err := a.Recv(polled, "node-1", transport.ChanData, buf); err != nil {
					t.Fatal(err)
				}
			})
			if err := <-echoed; err != nil {
				t.Fatalf("echo: %v", err)
			}
			// AllocsPerRun counts the whole process, echo side included.
			limit := 0.0
			if !tc.insecure {
				limit = float64(2*(tc.size/(16<<10)+1) + 2)
			}
			t.Logf("%v allocations per round trip (limit %v)", allocs, limit)
			if allocs > limit {
				t.Errorf("%v allocations per round trip, want at most %v", allocs, limit)
			}
		})
	}
}

// TestSendCancelled checks that a Send blocked on a receiver that does not
// read returns promptly when its context ends, and that the channel works
// again afterwards: the receiver gets a PeerError for the cut message, then
// the messages sent on the new streams.
func TestSendCancelled(t *testing.T) {
	for _, k := range []int{1, 2} {
		t.Run(fmt.Sprintf("stripes=%d", k), func(t *testing.T) {
			ctx := testContext(t, 30*time.Second)
			nodes := newNodes(false, func(c *Config) { c.Stripes = k })(t, 2)
			a, b := nodes[0].T, nodes[1].T
			if err := a.Connect(ctx, "node-1", nodes[1].Addr); err != nil {
				t.Fatal(err)
			}
			const d = 200 * time.Millisecond
			sctx, cancel := context.WithTimeout(ctx, d)
			defer cancel()
			start := time.Now()
			err := a.Send(sctx, "node-1", transport.ChanData, wire.Header{Kind: wire.KindData, Seq: 1}, make([]byte, 64<<20))
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Send to a receiver that does not read: %v, want DeadlineExceeded", err)
			}
			if late := time.Since(start) - d; late > time.Second {
				t.Errorf("Send returned %v after its deadline", late)
			}
			p := make([]byte, 1000)
			transporttest.FillPattern(p, 2)
			if err := a.Send(ctx, "node-1", transport.ChanData, wire.Header{Kind: wire.KindData, Seq: 2}, p); err != nil {
				t.Fatalf("Send after a cancelled Send: %v", err)
			}
			buf := make([]byte, 1000)
			deadline := time.Now().Add(5 * time.Second)
			sawCut := false
			for {
				h, n, err := b.Recv(ctx, "node-0", transport.ChanData, buf)
				if err == nil {
					if h.Seq != 2 || n != len(p) || transporttest.CheckPattern(buf[:n], 2) != nil {
						t.Fatalf("got seq %d, %d bytes; want the message sent after the cancel", h.Seq, n)
					}
					break
				}
				if !errors.Is(err, transport.ErrPeerGone) || time.Now().After(deadline) {
					t.Fatalf("Recv: %v, want the cut message to fail with ErrPeerGone, then the next one", err)
				}
				sawCut = true
			}
			// Usually the receiver first reports the cut message. About one
			// run in 20 under -race on 2 cores it does not: that stream
			// simply ends where the previous message did, as if the
			// cancelled Send never wrote a byte (not yet explained). Either
			// way the next message arrives intact, which is what matters.
			t.Logf("cut message reported: %v", sawCut)
		})
	}
}

// TestRefusalsReported: the accepting side lists both kinds of refusal: a
// client that refused its certificate (by address), and a client whose
// certificate it refused itself (with the name the certificate claims).
func TestRefusalsReported(t *testing.T) {
	ctx := testContext(t, 30*time.Second)
	a := newNode(t, transporttest.NewCA(t), "a", nil)
	b := newNode(t, transporttest.NewCA(t), "b", nil)
	if err := b.Connect(ctx, "a", a.Addr()); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("Connect with another secret: %v, want ErrUnauthenticated", err)
	}
	// b's Connect returns on its own side's verdict; a records the
	// refusal when its handshake sees b's alert, which under load can
	// come after g's below.
	for deadline := time.Now().Add(5 * time.Second); len(a.Refusals()) < 1 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	g := newNode(t, transporttest.NewCA(t), "g", nil)
	g.clientTLS = transporttest.Issue(t, transporttest.NewCA(t), "g").ClientTLS(ALPN)
	g.clientTLS.InsecureSkipVerify = true
	g.clientTLS.RootCAs = nil
	if err := g.Connect(ctx, "a", a.Addr()); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("Connect with another secret: %v, want ErrUnauthenticated", err)
	}
	var refs []transport.Refusal
	for deadline := time.Now().Add(5 * time.Second); len(refs) < 2 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		refs = a.Refusals()
	}
	if len(refs) != 2 || refs[0].Claimed != "" || refs[1].Claimed != "g" {
		t.Fatalf("Refusals = %+v, want the distrusting client, then g by name", refs)
	}
	for _, r := range refs {
		if !errors.Is(r.Err, transport.ErrUnauthenticated) || r.Remote == "" {
			t.Errorf("refusal %+v", r)
		}
	}
}

// TestFloodIsBounded: silent connections past maxPending are closed at
// once, and a burst of handshakes with another cluster's certificate is
// refused while a legitimate pair keeps exchanging, with a handful of log
// lines for the whole flood.
func TestFloodIsBounded(t *testing.T) {
	ctx := testContext(t, 2*time.Minute)
	ca := transporttest.NewCA(t)
	var serverLog transporttest.LogBuffer
	a := newNode(t, ca, "a", func(c *Config) {
		// The silent connections must stay open until the test closes
		// them, however long a loaded machine takes to open them all.
		// With the default 2 s for a first byte, the first ones were
		// closed before the last were open, and counted as refused.
		c.HandshakeTimeout = time.Minute
		c.firstByteTimeout = time.Minute
		c.Logger = zerolog.New(&serverLog)
		c.logEveryRefusal = false
	})
	b := newNode(t, ca, "b", nil)
	if err := b.Connect(ctx, "a", a.Addr()); err != nil {
		t.Fatal(err)
	}
	if err := a.Connect(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}
	// b's connection gives back its pending slot once handed to the core,
	// which may be just after b's Connect returns.
	for deadline := time.Now().Add(10 * time.Second); len(a.pending) > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d connections still pending after the legitimate one was accepted", len(a.pending))
		}
	}
	stopTraffic := keepExchanging(ctx, a, b)
	start := time.Now()

	const silent, refused = maxPending + 300, 300
	var conns []net.Conn
	for range silent {
		c, err := net.Dial("tcp", a.Addr())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	// A read returns when the server closes the connection, or the test.
	var closed atomic.Int64
	var readers sync.WaitGroup
	for _, c := range conns {
		readers.Go(func() {
			c.Read(make([]byte, 1))
			closed.Add(1)
		})
	}
	for deadline := time.Now().Add(30 * time.Second); closed.Load() < refused && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // time for a close too many to show
	n := closed.Load()
	for _, c := range conns {
		c.Close()
	}
	readers.Wait()
	if n != refused {
		t.Fatalf("%d of %d silent connections were closed at once, want the %d past maxPending", n, silent, refused)
	}

	// 160 handshakes, each refused by the certificate check: far more
	// than a window logs one by one. More only cost time: about 20 ms of
	// CPU each under -race.
	const dialers, each = 16, 10
	other := transporttest.Issue(t, transporttest.NewCA(t), "intruder").ClientTLS(ALPN)
	other.InsecureSkipVerify = true
	other.RootCAs = nil
	var wg sync.WaitGroup
	for range dialers {
		wg.Go(func() {
			for range each {
				c, err := net.Dial("tcp", a.Addr())
				if err != nil {
					continue
				}
				c.SetDeadline(time.Now().Add(5 * time.Second))
				tls.Client(c, other).Handshake()
				c.Close()
			}
		})
	}
	wg.Wait()
	if err := stopTraffic(); err != nil {
		t.Fatalf("legitimate traffic during the flood: %v", err)
	}
	a.Close()
	// At most floodlog.DefaultTotal lines and a summary per window: on a
	// loaded machine the flood may outlast one window, or two.
	elapsed := time.Since(start)
	windows := int(elapsed/floodlog.DefaultWindow) + 1
	log := serverLog.String()
	if n := strings.Count(log, `"level":"warn"`); n > windows*(floodlog.DefaultTotal+1) {
		t.Fatalf("%d warnings for a flood of %d connections in %v (%d windows of %v):\n%s",
			n, silent+dialers*each, elapsed, windows, floodlog.DefaultWindow, log)
	}
	// Every refusal is logged or counted: the summaries hold the
	// handshakes with the wrong certificate, past the first few lines.
	summed := 0
	for _, m := range regexp.MustCompile(`"refused":(\d+)`).FindAllStringSubmatch(log, -1) {
		n, _ := strconv.Atoi(m[1])
		summed += n
	}
	if summed == 0 || !strings.Contains(log, "refused: too many connections are awaiting their handshake") {
		t.Fatalf("the log does not show the refusals and their summary:\n%s", log)
	}
	if summed < dialers*each {
		t.Fatalf("the summaries count %d refusals, want the %d handshakes at least:\n%s", summed, dialers*each, log)
	}
}

// TestSetStripes: a channel set to 4 stripes at run time dials the links
// Connect did not when a large message first needs them, and the message
// arrives intact over them; a bad count is refused.
func TestSetStripes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ca := transporttest.NewCA(t)
	a, b := newNode(t, ca, "a", nil), newNode(t, ca, "b", nil)
	for _, k := range []int{0, 256} {
		if err := a.SetStripes(transport.ChanData, k); err == nil {
			t.Fatalf("SetStripes(data, %d) accepted", k)
		}
	}
	if err := a.SetStripes(transport.ChanData, 4); err != nil || a.Stripes(transport.ChanData) != 4 {
		t.Fatalf("SetStripes(data, 4): %v; Stripes = %d", err, a.Stripes(transport.ChanData))
	}
	if err := a.Connect(ctx, "b", b.Addr()); err != nil {
		t.Fatal(err)
	}
	if n := a.core.LinkCount("b"); n != 1 {
		t.Fatalf("Connect dialed %d links, want Config.Stripes 1", n)
	}
	exchange(t, ctx, a, b, "a", "b", 2, 3<<20+7)
	if n := a.core.LinkCount("b"); n != 4 {
		t.Fatalf("a holds %d links to b, want 4", n)
	}
	if s := a.LinkStats(); s.Connects != 1 || s.DialErrors != 0 || s.LinkFailures != 0 {
		t.Fatalf("LinkStats %+v, want one connect and no errors", s)
	}
}
