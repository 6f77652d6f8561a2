package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// helloTimeout bounds how long an accepted stream may take to send its
// Hello, so a silent stream does not hold a goroutine for long.
const helloTimeout = 5 * time.Second

// maxGens bounds the stream generations queued on one (peer, channel). A
// peer that reopens a channel more often than it is read loses its oldest
// unread streams rather than piling up connections.
const maxGens = 4

// MaxStripes bounds a stripe count: the Hello carries it in a byte.
const MaxStripes = 255

// SendBuffer is the bytes of messages, frame headers included, that the
// tcp and quic transports promise to hold unreceived on one (peer,
// channel) without blocking a Send (transport.SendBufferer).
const SendBuffer = 16 << 10

// errSuperseded is why streams evicted by newer ones were closed.
var errSuperseded = errors.New("streams superseded by newer ones from the same peer")

// Stream is an outbound byte stream (tcp: a connection; quic: a send
// stream). Close must unblock a concurrent Write.
type Stream interface {
	io.Writer
	io.Closer
}

// InStream is an accepted inbound byte stream. Close must unblock a
// concurrent Read; SetReadDeadline must make a blocked Read return a
// timeout error and leave the stream readable once the deadline is cleared.
type InStream interface {
	io.Reader
	io.Closer
	SetReadDeadline(time.Time) error
}

// Poller is an InStream that can poll its socket before sleeping, for
// transport.WithPoll: SetPoll(d) makes its reads that find nothing poll
// for up to d, until SetPoll(0).
type Poller interface {
	SetPoll(d time.Duration)
}

// Link is one authenticated connection to a peer that can open outbound
// streams.
type Link interface {
	// OpenStream opens a new outbound stream for ch (which the core names
	// again in the stream's Hello; a link may size the stream by it). It
	// blocks until the stream is usable or ctx is done, and is safe for
	// concurrent use.
	OpenStream(ctx context.Context, ch transport.Channel) (Stream, error)
	// Close releases the link. Streams it opened are closed by the core.
	Close() error
}

// DialFunc establishes one Link to peer at addr. It must return an error
// wrapping transport.ErrUnauthenticated when the peer fails the
// certificate check. It blocks until the link is authenticated or ctx is
// done.
type DialFunc func(ctx context.Context, peer transport.PeerID, addr string) (Link, error)

// Config configures the core.
type Config struct {
	// ID is this process's peer ID, sent in every Hello.
	ID transport.PeerID
	// Limits bound what is accepted from peers. The zero value means
	// wire.DefaultLimits().
	Limits wire.Limits
	// Stripes is the number of links (connections) per peer for outbound
	// traffic, dialed at Connect, and every channel's initial stripe count
	// (SetStripes); 0 means 1. At most MaxStripes.
	Stripes int
	// Dial makes a Link; required.
	Dial DialFunc
	// Logger receives rejected hellos, dropped peers and broken streams.
	Logger zerolog.Logger
	// OnDrop, if set, is called once per drop of a peer, whether the core
	// dropped it itself (for malformed or oversized input) or Drop was
	// called, with the reason, after the peer's links and streams are
	// closed. It is not called for Close. It runs on the goroutine that
	// dropped the peer (a Recv, or the caller of Drop) outside the core's
	// locks, so it may call the core, but it should not block: a transport
	// uses it to close what the core does not own, such as the connections
	// the peer dialed.
	OnDrop func(peer transport.PeerID, reason error)
	// Orderly, if set, reports whether a link error is the peer's orderly
	// close (its process ended or it dropped this one), which is logged
	// at debug level rather than as a warning: at the end of every job
	// each worker sees all the others close.
	Orderly func(error) bool
	// ByPeer, if set, reports whether a link error is one the peer sent
	// (transport.ErrClosedByPeer): the errors it names are marked so.
	ByPeer func(error) bool
}

// byPeer marks err as the peer's doing if Config.ByPeer says it is.
func (t *Transport) byPeer(err error) error {
	if t.cfg.ByPeer != nil && err != nil && t.cfg.ByPeer(err) {
		return transport.ClosedByPeer(err)
	}
	return err
}

// Transport implements transport.Transport and transport.Dropper over the
// links and inbound streams of a concrete transport. It is safe for
// concurrent use, with at most one Recv at a time per (peer, channel).
type Transport struct {
	cfg    Config
	log    zerolog.Logger
	ctx    context.Context // cancelled by Close; ends Hello reads
	cancel context.CancelFunc
	done   chan struct{} // closed by Close
	wg     sync.WaitGroup

	mu     sync.Mutex
	closed bool
	peers  map[transport.PeerID]*peer
	// reopens counts Reopen calls. A stream records it when accepted, so
	// that one accepted before a Reopen is known as old even if its Hello
	// is read after.
	reopens uint64

	// links counts link events for LinkStats; connected lists every
	// peer whose links were ever up, Forget notwithstanding, so that
	// connecting again counts as a reconnect.
	links     struct{ connects, reconnects, dialErrors, failures atomic.Uint64 }
	connected map[transport.PeerID]bool

	// stripes is each channel's stripe count for new generations
	// (SetStripes).
	stripes [transport.NumChannels]atomic.Int32

	closeOnce sync.Once
}

var (
	_ transport.Transport = (*Transport)(nil)
	_ transport.Dropper   = (*Transport)(nil)
	_ transport.Forgetter = (*Transport)(nil)
	_ transport.Striper   = (*Transport)(nil)
)

// peer is everything known about one peer. Guarded by Transport.mu.
type peer struct {
	id  transport.PeerID
	out *outPeer // nil until Connect, and again after Drop
	in  [transport.NumChannels]*inSlot
}

// errDropped is the Drop reason when the caller gives none.
var errDropped = errors.New("dropped")

// New returns a core with no peers. Its goroutines are started lazily.
func New(cfg Config) (*Transport, error) {
	if cfg.Limits == (wire.Limits{}) {
		cfg.Limits = wire.DefaultLimits()
	}
	if err := cfg.Limits.Validate(); err != nil {
		return nil, fmt.Errorf("streams: %w", err)
	}
	if cfg.Stripes == 0 {
		cfg.Stripes = 1
	}
	if cfg.Stripes < 1 || cfg.Stripes > MaxStripes {
		return nil, fmt.Errorf("streams: Stripes must be 1 to %d, got %d", MaxStripes, cfg.Stripes)
	}
	if cfg.ID == "" || len(cfg.ID) > wire.MaxPeerID {
		return nil, fmt.Errorf("streams: ID must be 1 to %d bytes, got %d", wire.MaxPeerID, len(cfg.ID))
	}
	if cfg.Dial == nil {
		return nil, errors.New("streams: Dial is required")
	}
	t := &Transport{
		cfg:       cfg,
		log:       cfg.Logger,
		done:      make(chan struct{}),
		peers:     make(map[transport.PeerID]*peer),
		connected: make(map[transport.PeerID]bool),
	}
	for ch := range t.stripes {
		t.stripes[ch].Store(int32(cfg.Stripes))
	}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	return t, nil
}

// SetStripes makes the generations of ch's streams opened from now on
// use k stripes, 1 to MaxStripes (transport.Striper). Open generations
// keep theirs: the receiver split their messages by it. Links missing for
// k are dialed when a Send first opens a stripe on them.
func (t *Transport) SetStripes(ch transport.Channel, k int) error {
	if err := checkChannel(ch); err != nil {
		return err
	}
	if k < 1 || k > MaxStripes {
		return fmt.Errorf("stripes must be 1 to %d, got %d", MaxStripes, k)
	}
	t.stripes[ch].Store(int32(k))
	return nil
}

// Stripes returns ch's stripe count for new generations, 0 for an
// unknown channel.
func (t *Transport) Stripes(ch transport.Channel) int {
	if checkChannel(ch) != nil {
		return 0
	}
	return int(t.stripes[ch].Load())
}

// Localer is a Link that reaches its peer on this machine without the
// network (package shm's).
type Localer interface {
	Local() bool
}

// Local reports whether every link of this side's connection to peer is
// a Localer that says so; false if peer is not connected.
func (t *Transport) Local(peer transport.PeerID) bool {
	t.mu.Lock()
	p := t.peers[peer]
	var op *outPeer
	if p != nil {
		op = p.out
	}
	t.mu.Unlock()
	if op == nil {
		return false
	}
	select {
	case <-op.ready:
	default:
		return false // still dialing
	}
	if op.err != nil {
		return false
	}
	t.mu.Lock()
	links := op.links
	t.mu.Unlock()
	if len(links) == 0 {
		return false
	}
	for _, l := range links {
		if lo, ok := l.(Localer); !ok || !lo.Local() {
			return false
		}
	}
	return true
}

// LinkCount returns how many links to peer this side has dialed and
// still holds: Connect's, and those dialed since for stripes. For tests
// and diagnostics.
func (t *Transport) LinkCount(peer transport.PeerID) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[peer]; p != nil && p.out != nil && p.out.dead == nil {
		return len(p.out.links)
	}
	return 0
}

// peerLocked returns the state of id, creating it. t.mu must be held.
func (t *Transport) peerLocked(id transport.PeerID) *peer {
	p := t.peers[id]
	if p == nil {
		p = &peer{id: id}
		t.peers[id] = p
	}
	return p
}

// goLocked starts f as a goroutine that Close waits for. t.mu must be held
// and t.closed false.
func (t *Transport) goLocked(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// Connect dials cfg.Stripes links to peer at addr; a channel set to more
// stripes dials the rest when it first needs them. It is idempotent: a call
// for a connected peer returns nil, and concurrent calls for one peer share
// one dial. Dial errors are returned in a *transport.PeerError. It blocks
// until the links are up or ctx is done.
func (t *Transport) Connect(ctx context.Context, id transport.PeerID, addr string) error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return transport.ErrClosed
	}
	p := t.peerLocked(id)
	if op := p.out; op != nil {
		t.mu.Unlock()
		select {
		case <-op.ready:
			return op.err
		case <-ctx.Done():
			return ctx.Err()
		case <-t.done:
			return transport.ErrClosed
		}
	}
	op := newOutPeer(t, id, addr)
	p.out = op
	t.mu.Unlock()

	links := make([]Link, 0, t.cfg.Stripes)
	var err error
	for range t.cfg.Stripes {
		var l Link
		if l, err = t.cfg.Dial(ctx, id, addr); err != nil {
			break
		}
		links = append(links, l)
	}

	t.mu.Lock()
	switch {
	case t.closed:
		err = transport.ErrClosed
	case err != nil:
		t.links.dialErrors.Add(1)
		err = &transport.PeerError{Peer: id, Op: "connect", Err: err}
	case p.out != op:
		// Dropped while dialing.
		err = &transport.PeerError{Peer: id, Op: "connect", Err: op.dead}
	}
	if err != nil {
		if p.out == op {
			p.out = nil // a later Connect retries
		}
		op.err = err
		close(op.ready)
		t.mu.Unlock()
		for _, l := range links {
			l.Close()
		}
		return err
	}
	op.links = links
	// Striping a memory ring gains nothing: one stripe whatever is set.
	lo, ok := links[0].(Localer)
	op.local = ok && lo.Local()
	close(op.ready)
	t.links.connects.Add(1)
	if t.connected[id] {
		t.links.reconnects.Add(1)
	}
	t.connected[id] = true
	t.mu.Unlock()
	t.log.Debug().Str("peer", string(id)).Str("addr", addr).Int("stripes", len(links)).Msg("connected")
	return nil
}

// abandonLink closes op, the outbound links and streams of a peer whose
// link failed, if they are still the peer's: the next Connect dials
// afresh. Inbound streams and OnDrop are left alone.
func (t *Transport) abandonLink(op *outPeer, reason error) {
	t.mu.Lock()
	var closers []io.Closer
	if p := t.peers[op.id]; p != nil && p.out == op && !t.closed {
		p.out = nil
		closers = op.killLocked(reason, nil)
	}
	t.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
	if len(closers) > 0 {
		ev := t.log.Warn()
		var de *dialError
		switch {
		case t.cfg.Orderly != nil && t.cfg.Orderly(reason):
			ev = t.log.Debug()
		case errors.As(reason, &de):
			// Counted as a dial error: no link that was up failed.
		default:
			t.links.failures.Add(1)
		}
		ev.Str("peer", string(op.id)).AnErr("reason", reason).Msg("link failed; the next Connect dials afresh")
	}
}

// LinkStats counts the links' events so far. A Drop is the caller's
// decision, not a failure, and does not count. It does not block.
func (t *Transport) LinkStats() transport.LinkStats {
	return transport.LinkStats{Connects: t.links.connects.Load(), Reconnects: t.links.reconnects.Load(),
		DialErrors: t.links.dialErrors.Load(), LinkFailures: t.links.failures.Load()}
}

// Drop abandons peer: its links and streams are closed, its stripe
// writers stop, pending calls on it fail with a *transport.PeerError
// wrapping reason, and so do later Recvs until the peer opens new streams.
// Send needs a new Connect. Then Config.OnDrop runs. Drop does not block
// on the network; after Close it does nothing.
func (t *Transport) Drop(id transport.PeerID, reason error) { t.drop(id, reason, false) }

// Forget drops peer as Drop does and removes every record of it, its
// inbound stripe readers included, so that peers that come and go leave
// nothing behind; a later Connect or Recv treats it as a peer never seen.
func (t *Transport) Forget(id transport.PeerID) { t.drop(id, errForgotten, true) }

// errForgotten is the Drop reason of Forget.
var errForgotten = errors.New("forgotten")

func (t *Transport) drop(id transport.PeerID, reason error, forget bool) {
	if reason == nil {
		reason = errDropped
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	var closers []io.Closer
	p := t.peerLocked(id)
	if op := p.out; op != nil {
		p.out = nil
		closers = op.killLocked(reason, closers)
	}
	perr := &transport.PeerError{Peer: id, Op: "recv", Err: reason}
	for ch := range p.in {
		s := t.slotLocked(p, transport.Channel(ch))
		closers = s.killLocked(perr, closers)
		if forget {
			close(s.quit)
		}
	}
	if forget {
		delete(t.peers, id)
	}
	t.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
	ev := t.log.Warn()
	if errors.Is(reason, errDropped) || errors.Is(reason, errForgotten) || t.cfg.Orderly != nil && t.cfg.Orderly(reason) {
		ev = t.log.Debug() // the caller asked, or the peer closed in order
	}
	ev.Str("peer", string(id)).AnErr("reason", reason).Msg("dropped peer")
	if t.cfg.OnDrop != nil {
		t.cfg.OnDrop(id, reason)
	}
}

// Close closes every link and stream and unblocks pending calls with
// transport.ErrClosed. It is idempotent and returns once every goroutine of
// the core has ended.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		close(t.done)
		var closers []io.Closer
		for _, p := range t.peers {
			if op := p.out; op != nil {
				closers = op.killLocked(transport.ErrClosed, closers)
			}
			for _, s := range p.in {
				if s != nil {
					s.cc.releaseLocked()
					closers = s.killLocked(transport.ErrClosed, closers)
				}
			}
		}
		t.mu.Unlock()
		t.cancel()
		for _, c := range closers {
			c.Close()
		}
		t.wg.Wait()
	})
	return nil
}

// checkChannel returns transport.ErrBadChannel for an unknown channel.
func checkChannel(ch transport.Channel) error {
	if ch >= transport.NumChannels {
		return fmt.Errorf("%w: %d", transport.ErrBadChannel, ch)
	}
	return nil
}
