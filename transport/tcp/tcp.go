package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/refusals"
	"github.com/gyre-ml/gyre/transport/internal/shm"
	"github.com/gyre-ml/gyre/transport/internal/streams"
)

// Transport is the TCP transport. It implements transport.Transport,
// transport.Listener and transport.Dropper, and is safe for concurrent use.
type Transport struct {
	cfg      Config
	log      zerolog.Logger
	core     *streams.Transport
	refusals refusals.Log  // inbound connections refused by the certificate check
	flood    *floodlog.Log // the log of refused connections, rate-limited
	ln       net.Listener
	shm      *shm.Local // nil unless Config.SharedMemory
	// pending holds a token per accepted connection not yet handed to the
	// core, handshaking holds one per handshake under way: both bound what
	// unauthenticated clients can make this process spend.
	pending, handshaking chan struct{}
	clientTLS            *tls.Config // nil when insecure

	ctx    context.Context // cancelled by Close; aborts handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup

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
	log := cfg.Logger.With().Str("transport", "tcp").Str("id", string(cfg.ID)).Logger()
	t := &Transport{cfg: cfg, log: log, pending: make(chan struct{}, maxPending), handshaking: make(chan struct{}, maxHandshakes),
		flood: floodlog.New(floodlog.Config{Logger: log, What: "connections to the data port", Every: cfg.logEveryRefusal})}
	if cfg.Insecure {
		log.Warn().Msg("insecure: plain TCP, peers are neither authenticated nor encrypted")
	} else {
		t.clientTLS = cfg.Identity.ClientTLS(ALPN)
	}
	var err error
	t.core, err = streams.New(streams.Config{
		ID:      cfg.ID,
		Limits:  cfg.Limits,
		Stripes: cfg.Stripes,
		Dial:    shm.Or(func() *shm.Local { return t.shm }, t.dial),
		// TCP cannot tell a peer's close from its crash; shared memory can.
		Orderly: func(err error) bool { return errors.Is(err, shm.ErrReaderClosed) },
		Logger:  log,
	})
	if err != nil {
		return nil, fmt.Errorf("tcp: %w", err)
	}
	var lc net.ListenConfig
	t.ln, err = lc.Listen(context.Background(), "tcp", cfg.Listen)
	if err != nil {
		t.core.Close()
		return nil, fmt.Errorf("tcp: %w", err)
	}
	if cfg.SharedMemory {
		t.shm = shm.Beside(shm.Config{ID: cfg.ID, Identity: cfg.Identity, Insecure: cfg.Insecure,
			Kind: "tcp", Port: t.ln.Addr().(*net.TCPAddr).Port, Accept: t.core.Accept, Refused: t.refusals.Add, Flood: t.flood,
			HandshakeTimeout: cfg.HandshakeTimeout, Logger: log})
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	t.wg.Go(t.acceptLoop)
	log.Debug().Str("addr", t.Addr()).Int("stripes", cfg.Stripes).Bool("insecure", cfg.Insecure).Msg("listening")
	return t, nil
}

// Addr returns the bound address, which peers pass to Connect.
func (t *Transport) Addr() string { return t.ln.Addr().String() }

// Connect opens and authenticates a first connection to peer at addr for
// each stripe, so a wrong secret or a wrong address fails here, with an
// error wrapping transport.ErrUnauthenticated. See transport.Transport.
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

// Drop forgets peer: its connections, both those this side dialed and
// those it accepted, are closed, and pending calls fail with a
// transport.PeerError wrapping reason. Drop does not block.
func (t *Transport) Drop(peer transport.PeerID, reason error) {
	t.core.Drop(peer, reason)
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

// SendBuffer is what a connection usually holds unreceived without
// blocking a write (transport.SendBufferer): the peer's initial receive
// window on Linux is 64 KiB or more (net.ipv4.tcp_rmem), and the socket's
// own send buffer adds to it.
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
		return fmt.Errorf("tcp: %w", err)
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

// Close stops listening, closes every connection and unblocks pending
// calls with transport.ErrClosed. It is idempotent and returns once every
// goroutine of the transport has ended.
func (t *Transport) Close() error {
	var err error
	t.closeOnce.Do(func() {
		t.cancel()
		err = t.ln.Close()
		if t.shm != nil {
			t.shm.Close()
		}
		t.core.Close()
		t.wg.Wait()
		t.flood.Close()
		t.log.Debug().Msg("closed")
	})
	return err
}
