package quic

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"

	quicgo "github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/refusals"
	"github.com/gyre-ml/gyre/transport/internal/shm"
	"github.com/gyre-ml/gyre/transport/internal/streams"
)

// Application error codes sent in CONNECTION_CLOSE and stream resets. The
// peer only logs them; what matters is that it learns at once.
const (
	codeClosed          quicgo.ApplicationErrorCode = 0 // orderly close
	codeDropped         quicgo.ApplicationErrorCode = 1 // the peer was dropped
	codeUnauthenticated quicgo.ApplicationErrorCode = 2 // wrong certificate name
	codeStreamClosed    quicgo.StreamErrorCode      = 0
)

// Transport is the QUIC transport. It implements transport.Transport,
// transport.Listener and transport.Dropper, and is safe for concurrent use.
type Transport struct {
	cfg      Config
	log      zerolog.Logger
	core     *streams.Transport
	refusals refusals.Log  // inbound connections refused by the certificate check
	flood    *floodlog.Log // the log of refused connections, rate-limited
	// handshaking counts the incoming handshakes under way (connContext).
	handshaking atomic.Int64

	udp *net.UDPConn
	qt  *quicgo.Transport
	ln  *quicgo.Listener
	shm *shm.Local // nil unless Config.SharedMemory

	ctx    context.Context // cancelled by Close; ends the accept loops
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	inbound map[*quicgo.Conn]transport.PeerID // accepted connections, closed by Drop and Close
	closed  bool

	closeOnce sync.Once
}

var (
	_ transport.Transport            = (*Transport)(nil)
	_ transport.Listener             = (*Transport)(nil)
	_ transport.Dropper              = (*Transport)(nil)
	_ transport.Forgetter            = (*Transport)(nil)
	_ transport.RefusalReporter      = (*Transport)(nil)
	_ transport.RefusalCounter       = (*Transport)(nil)
	_ transport.LinkCounter          = (*Transport)(nil)
	_ transport.SharedMemoryReporter = (*Transport)(nil)
	_ transport.Striper              = (*Transport)(nil)
)

// New binds cfg.Listen and starts accepting connections.
func New(cfg Config) (*Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger.With().Str("transport", "quic").Str("id", string(cfg.ID)).Logger()

	laddr, err := net.ResolveUDPAddr("udp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("quic: listen address: %w", err)
	}
	udp, err := net.ListenUDP("udp", laddr)
	if err != nil {
		return nil, fmt.Errorf("quic: %w", err)
	}
	setSocketBuffers(udp, log)

	// A stateless reset key lets this process tell a peer at once that a
	// connection it no longer knows is gone, instead of the peer waiting
	// for its idle timeout. See Config.ResetKey.
	var resetKey quicgo.StatelessResetKey
	if cfg.ResetKey != nil {
		resetKey = *cfg.ResetKey
	} else if _, err := rand.Read(resetKey[:]); err != nil {
		udp.Close()
		return nil, fmt.Errorf("quic: stateless reset key: %w", err)
	}
	t := &Transport{
		cfg:     cfg,
		log:     log,
		udp:     udp,
		inbound: make(map[*quicgo.Conn]transport.PeerID),
		flood:   floodlog.New(floodlog.Config{Logger: log, What: "connections to the data port", Every: cfg.logEveryRefusal}),
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.qt = &quicgo.Transport{
		Conn:              udp,
		StatelessResetKey: &resetKey,
		ConnContext:       t.connContext,
		// Under a burst of handshakes, a client first proves that it
		// receives at its address (a Retry), so that spoofed addresses
		// cost no handshake.
		VerifySourceAddress: func(net.Addr) bool { return t.handshaking.Load() > maxHandshakes/2 },
	}
	t.ln, err = t.qt.Listen(t.serverTLS(), cfg.quicConfig(false))
	if err != nil {
		t.cancel()
		t.qt.Close()
		udp.Close()
		return nil, fmt.Errorf("quic: listen: %w", err)
	}
	t.core, err = streams.New(streams.Config{
		ID:      cfg.ID,
		Limits:  cfg.Limits,
		Stripes: cfg.Stripes,
		Dial:    shm.Or(func() *shm.Local { return t.shm }, t.dial),
		Logger:  log,
		OnDrop:  t.onDrop,
		Orderly: orderly,
		ByPeer:  byPeer,
	})
	if err != nil {
		t.cancel()
		t.ln.Close()
		t.qt.Close()
		udp.Close()
		return nil, fmt.Errorf("quic: %w", err)
	}
	if cfg.SharedMemory {
		t.shm = shm.Beside(shm.Config{ID: cfg.ID, Identity: cfg.Identity, Kind: "quic",
			Port: udp.LocalAddr().(*net.UDPAddr).Port, Accept: t.core.Accept, Refused: t.refusals.Add, Flood: t.flood,
			HandshakeTimeout: cfg.HandshakeTimeout, Logger: log})
	}
	t.wg.Go(t.acceptLoop)
	log.Debug().Str("addr", t.Addr()).Int("stripes", cfg.Stripes).Bool("shared_memory", t.shm != nil).Msg("listening")
	return t, nil
}

// byPeer reports whether the peer sent err: it ended its stream (FIN),
// reset or stopped one, or closed the connection with an application
// error. A crashed process sends none of these: its peers see a stateless
// reset or an idle timeout.
func byPeer(err error) bool {
	var ae *quicgo.ApplicationError
	var se *quicgo.StreamError
	return errors.Is(err, io.EOF) || errors.As(err, &ae) && ae.Remote || errors.As(err, &se) && se.Remote
}

// orderly reports whether err is a peer's orderly close of a connection
// or stream (codeClosed, codeStreamClosed), or of a shared-memory stream
// (shm.ErrReaderClosed).
func orderly(err error) bool {
	var ae *quicgo.ApplicationError
	if errors.As(err, &ae) {
		return ae.Remote && ae.ErrorCode == codeClosed
	}
	var se *quicgo.StreamError
	return errors.As(err, &se) && se.Remote && se.ErrorCode == codeStreamClosed || errors.Is(err, shm.ErrReaderClosed)
}

// Addr returns the bound UDP address, which peers pass to Connect.
func (t *Transport) Addr() string { return t.udp.LocalAddr().String() }

// Connect dials peer at addr (cfg.Stripes connections) and checks that its
// certificate names peer. See transport.Transport.
func (t *Transport) Connect(ctx context.Context, peer transport.PeerID, addr string) error {
	return t.core.Connect(ctx, peer, addr)
}

// Send sends one message to peer on ch. See transport.Transport.
func (t *Transport) Send(ctx context.Context, peer transport.PeerID, ch transport.Channel, hdr wire.Header, payload []byte) error {
	return t.core.Send(ctx, peer, ch, hdr, payload)
}

// Recv receives the next message from peer on ch into buf. See
// transport.Transport.
func (t *Transport) Recv(ctx context.Context, peer transport.PeerID, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	return t.core.Recv(ctx, peer, ch, buf)
}

// Drop forgets peer: pending calls fail with a PeerError wrapping reason,
// and the connections it dialed to this process are closed, so the peer
// learns at once that it was dropped.
func (t *Transport) Drop(peer transport.PeerID, reason error) {
	t.core.Drop(peer, reason) // calls onDrop
}

// Refusals returns the recent inbound connections refused for a
// certificate this cluster's CA did not issue (transport.RefusalReporter).
func (t *Transport) Refusals() []transport.Refusal { return t.refusals.List() }

// RefusalsTotal counts every connection refused for its credentials
// (transport.RefusalCounter).
func (t *Transport) RefusalsTotal() uint64 { return t.refusals.Total() }

// SharedMemory reports whether this side's links to peer go through
// shared memory (transport.SharedMemoryReporter).
func (t *Transport) SharedMemory(peer transport.PeerID) bool { return t.core.Local(peer) }

// LinkStats counts the links' connects, reconnects, dial errors and
// failures (transport.LinkCounter).
func (t *Transport) LinkStats() transport.LinkStats { return t.core.LinkStats() }

// SendBuffer is what a stream usually holds unreceived without blocking
// a write (transport.SendBufferer): far below quic-go's initial
// flow-control windows (512 KiB a stream, shared by the connection's
// streams up to its own window) and its initial congestion window (about
// 40 kB).
func (t *Transport) SendBuffer() int { return streams.SendBuffer }

// SetStripes makes ch's next generation of streams to each peer use k
// stripes, 1 to 255 (transport.Striper); Config.Stripes is every
// channel's initial count. Connections that a larger count needs are
// dialed when a large message first needs them. A generation already
// open keeps its count, so both sides Reopen ch at an idle point, or it is
// set before ch's first Send; a peer reached through shared memory keeps
// one stripe.
func (t *Transport) SetStripes(ch transport.Channel, k int) error {
	if err := t.core.SetStripes(ch, k); err != nil {
		return fmt.Errorf("quic: %w", err)
	}
	return nil
}

// Stripes returns ch's stripe count for new generations
// (transport.Striper).
func (t *Transport) Stripes(ch transport.Channel) int { return t.core.Stripes(ch) }

// Reopen makes the next Send to peer on ch open new streams
// (transport.Reopener).
func (t *Transport) Reopen(peer transport.PeerID, ch transport.Channel) { t.core.Reopen(peer, ch) }

// Forget drops peer and releases every record of it (transport.Forgetter).
func (t *Transport) Forget(peer transport.PeerID) {
	t.core.Forget(peer) // calls onDrop
}

// onDrop is the core's Config.OnDrop. It runs for Drop and for peers the
// core dropped itself for malformed or oversized input: the connections
// the peer dialed here go too, with whatever they have buffered. Only the
// core's streams on them are closed by the core, not the connections.
func (t *Transport) onDrop(peer transport.PeerID, reason error) {
	msg := "dropped"
	if errors.Is(reason, wire.ErrMalformed) || errors.Is(reason, wire.ErrTooLarge) {
		msg = "malformed input"
	}
	t.closeInbound(peer, codeDropped, msg)
}

// Close closes every connection and the socket, and unblocks pending calls
// with transport.ErrClosed. It is idempotent.
func (t *Transport) Close() error {
	var err error
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		t.mu.Unlock()
		t.cancel()
		if t.shm != nil {
			t.shm.Close()
		}
		err = t.core.Close()
		t.closeInbound("", codeClosed, "closed")
		// Listener and Transport close after the connections, so the
		// CONNECTION_CLOSE frames above are sent rather than cut off.
		err = errors.Join(err, t.ln.Close(), t.qt.Close(), t.udp.Close())
		t.wg.Wait()
		t.flood.Close()
		t.log.Debug().Msg("closed")
	})
	return err
}

// closeInbound closes the accepted connections from peer, or all of them
// if peer is empty.
func (t *Transport) closeInbound(peer transport.PeerID, code quicgo.ApplicationErrorCode, msg string) {
	t.mu.Lock()
	var conns []*quicgo.Conn
	for c, p := range t.inbound {
		if peer == "" || p == peer {
			conns = append(conns, c)
		}
	}
	t.mu.Unlock()
	for _, c := range conns {
		c.CloseWithError(code, msg)
	}
}
