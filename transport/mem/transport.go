package mem

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

var (
	_ transport.Transport = (*Transport)(nil)
	_ transport.Listener  = (*Transport)(nil)
	_ transport.Dropper   = (*Transport)(nil)
	_ transport.Forgetter = (*Transport)(nil)
)

// Transport is one node's end of a Network. It implements
// transport.Transport, transport.Listener and transport.Dropper, and is
// safe for concurrent use (with at most one Recv at a time per peer and
// channel, as the interface requires).
//
// A connection (a session) joins two transports. Either side's Connect
// creates it, and both sides may then Recv on it; only a side that called
// Connect may Send. A session that failed stays in place, so later calls
// keep reporting the failure, until a new Connect from either side replaces
// it.
type Transport struct {
	net  *Network
	id   transport.PeerID
	done chan struct{} // closed by Close or Kill

	mu    sync.Mutex
	peers map[transport.PeerID]*peer

	// frozen is non-nil while Network.Freeze holds the node, and closed by
	// Thaw.
	frozenMu sync.Mutex
	frozen   chan struct{}
}

// peer is what a transport knows about one remote id.
type peer struct {
	sess      *session // current session, nil until either side connects
	side      int      // this transport's end of sess
	connected bool     // this side called Connect, so it may Send
	// gone is why the remote went away while there was no session; it is
	// cleared by the next session.
	gone error
	// wait is closed and replaced whenever sess or gone changes; a Recv
	// with no session waits on it.
	wait chan struct{}
}

func (p *peer) changed() {
	close(p.wait)
	p.wait = make(chan struct{})
}

// ID returns the id the transport joined under.
func (t *Transport) ID() transport.PeerID { return t.id }

// Addr returns the address peers pass to Connect: the id itself.
func (t *Transport) Addr() string { return string(t.id) }

// Connect makes peer reachable for Send. addr must be the address (the id)
// of a live node of the same Network, and that node's id must be peer.
// It is idempotent and does not block. Connect ignores faults: a link that
// drops everything or a partition still lets it succeed.
func (t *Transport) Connect(ctx context.Context, peer transport.PeerID, addr string) error {
	if t.isClosed() {
		return transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	return t.net.connectLocked(t, peer, addr)
}

// SendBuffer is unbounded (transport.SendBufferer): Send queues a copy
// and never waits for the receiver.
func (t *Transport) SendBuffer() int { return math.MaxInt }

// Send copies payload into the receiver's queue and returns without
// waiting for the receiver; the caller may reuse payload at once. A message
// lost to a fault still returns nil, as a packet lost on a real network
// would. Send fails with an error wrapping transport.ErrNotConnected if
// this side never connected to peer, with one wrapping wire.ErrMalformed if
// hdr has a field out of range (the real transports' receivers would reject
// it), and with a *transport.PeerError once the session with peer failed.
func (t *Transport) Send(ctx context.Context, peer transport.PeerID, ch transport.Channel, hdr wire.Header, payload []byte) error {
	if ch >= transport.NumChannels {
		return fmt.Errorf("mem: send to %s on %v: %w", peer, ch, transport.ErrBadChannel)
	}
	if t.isClosed() {
		return transport.ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := t.waitThawed(ctx); err != nil {
		return err
	}
	t.mu.Lock()
	var s *session
	var side int
	if p := t.peers[peer]; p != nil && p.connected {
		s, side = p.sess, p.side
	}
	t.mu.Unlock()
	if s == nil {
		return fmt.Errorf("mem: send to %s: %w", peer, transport.ErrNotConnected)
	}
	hdr.Len = uint64(len(payload))
	if err := validate(hdr); err != nil {
		return fmt.Errorf("mem: send to %s: %w", peer, err)
	}
	err := s.send(t.net, side, ch, hdr, payload)
	if err != nil && t.isClosed() {
		return transport.ErrClosed
	}
	return err
}

// validate rejects a header that the real transports' receivers would
// reject as malformed or too large, so that tests over mem catch such
// caller bugs too. It encodes the header as a frame and decodes it again,
// which keeps it in step with the wire package without allocating.
func validate(h wire.Header) error {
	var b [wire.FrameHeaderSize]byte
	f := wire.FrameHeader{Header: h}
	f.Encode(b[:])
	_, err := wire.Decode(b[:], wire.DefaultLimits())
	return err
}

// Recv waits for the next message from peer on ch and copies it into buf.
// It waits for a session if there is none yet, so the receiver need not
// call Connect. It fails with a *transport.PeerError once the session
// failed and no message sent before the failure remains.
func (t *Transport) Recv(ctx context.Context, peer transport.PeerID, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	if ch >= transport.NumChannels {
		return wire.Header{}, 0, fmt.Errorf("mem: recv from %s on %v: %w", peer, ch, transport.ErrBadChannel)
	}
	for {
		if t.isClosed() {
			return wire.Header{}, 0, transport.ErrClosed
		}
		t.mu.Lock()
		p := t.peerLocked(peer)
		s, side, gone, wait := p.sess, p.side, p.gone, p.wait
		t.mu.Unlock()
		if s != nil {
			return s.recv(ctx, t, side, ch, buf)
		}
		if gone != nil {
			return wire.Header{}, 0, &transport.PeerError{Peer: peer, Op: "recv", Err: gone}
		}
		select {
		case <-wait:
		case <-ctx.Done():
			return wire.Header{}, 0, ctx.Err()
		case <-t.done:
			return wire.Header{}, 0, transport.ErrClosed
		}
	}
}

// Close closes the transport: pending and later calls return
// transport.ErrClosed. Peers still receive what it sent before closing,
// then fail with a *transport.PeerError wrapping ErrPeerClosed. Close is
// idempotent and always returns nil.
func (t *Transport) Close() error {
	t.net.mu.Lock()
	defer t.net.mu.Unlock()
	t.net.shutLocked(t, ErrPeerClosed)
	return nil
}

// Drop abandons peer: messages queued either way are lost, this side's
// pending and later calls with peer fail with a *transport.PeerError
// wrapping reason, and the peer's fail with one wrapping ErrDropped. A
// later Connect from either side opens a fresh session.
func (t *Transport) Drop(peer transport.PeerID, reason error) {
	if reason == nil {
		reason = fmt.Errorf("mem: %s dropped %s", t.id, peer)
	}
	n := t.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if t.isClosed() {
		return
	}
	t.mu.Lock()
	p := t.peerLocked(peer)
	s, side := p.sess, p.side
	if s == nil {
		p.gone = reason
		p.changed()
	}
	t.mu.Unlock()
	if s != nil {
		var causes [2]error
		causes[side], causes[1-side] = reason, ErrDropped
		s.fail(causes, [2]bool{}, &n.pool)
	}
}

// Forget drops peer and removes every record of it: a later Connect or
// Recv treats it as a peer never seen (transport.Forgetter).
func (t *Transport) Forget(peer transport.PeerID) {
	t.Drop(peer, fmt.Errorf("mem: %s forgot %s", t.id, peer))
	t.mu.Lock()
	if p := t.peers[peer]; p != nil {
		p.changed() // wake a Recv waiting for a session: it finds none and waits anew
		delete(t.peers, peer)
	}
	t.mu.Unlock()
}

func (t *Transport) isClosed() bool {
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

// peerLocked returns the entry for id, creating it. t.mu must be held.
func (t *Transport) peerLocked(id transport.PeerID) *peer {
	p := t.peers[id]
	if p == nil {
		p = &peer{wait: make(chan struct{})}
		t.peers[id] = p
	}
	return p
}

// setSession makes s the session with id, t being end side of it.
func (t *Transport) setSession(id transport.PeerID, s *session, side int, connected bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.peerLocked(id)
	p.sess, p.side, p.gone = s, side, nil
	p.connected = p.connected || connected
	p.changed()
}
