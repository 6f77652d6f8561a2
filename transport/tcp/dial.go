package tcp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
	"github.com/gyre-ml/gyre/transport/internal/tlsutil"
)

// spareTTL is how long a link keeps the connection it authenticated at
// Connect for its first stream. It is well below the server's deadline for
// the stream's Hello, so a spare is never handed out after the server has
// given up on it; an unused spare is closed.
const spareTTL = 2 * time.Second

// dial is the core's DialFunc: it authenticates one connection to peer at
// addr at once, so Connect reports a wrong secret or address, and keeps it
// for the link's first stream.
func (t *Transport) dial(ctx context.Context, peer transport.PeerID, addr string) (streams.Link, error) {
	s, err := t.dialStream(ctx, peer, addr)
	if err != nil {
		return nil, err
	}
	l := &link{t: t, peer: peer, addr: addr, spare: s}
	l.timer = time.AfterFunc(spareTTL, l.dropSpare)
	return l, nil
}

// link dials a new connection for every stream the core opens to one
// peer on one stripe.
type link struct {
	t    *Transport
	peer transport.PeerID
	addr string

	mu     sync.Mutex
	spare  streams.Stream // authenticated at Connect, not yet used
	timer  *time.Timer
	closed bool
}

func (l *link) OpenStream(ctx context.Context, _ transport.Channel) (streams.Stream, error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, net.ErrClosed
	}
	if s := l.spare; s != nil {
		l.spare = nil
		l.timer.Stop()
		l.mu.Unlock()
		return s, nil
	}
	l.mu.Unlock()
	return l.t.dialStream(ctx, l.peer, l.addr)
}

func (l *link) dropSpare() {
	l.mu.Lock()
	s := l.spare
	l.spare = nil
	l.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

func (l *link) Close() error {
	l.mu.Lock()
	l.closed = true
	l.timer.Stop()
	l.mu.Unlock()
	l.dropSpare()
	return nil
}

// dialStream opens one connection to peer at addr and waits until the
// server has accepted it. It honours ctx and HandshakeTimeout throughout.
func (t *Transport) dialStream(ctx context.Context, peer transport.PeerID, addr string) (streams.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tune(c)
	// A past deadline is what interrupts the handshake and the wait for the
	// acknowledgement when ctx ends.
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(longAgo) })
	s, err := t.handshake(c, peer, addr)
	if !stop() {
		// ctx ended: the deadline is (or is about to be) in the past.
		c.Close()
		switch {
		case err == nil:
			err = ctx.Err()
		case !errors.Is(err, transport.ErrUnauthenticated):
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return s, nil
}

// handshake runs the client side of a new connection: the TLS handshake
// and certificate check, or the plain preamble, then the acknowledgement.
func (t *Transport) handshake(c net.Conn, peer transport.PeerID, addr string) (streams.Stream, error) {
	if t.cfg.Insecure {
		if _, err := c.Write([]byte(plainPreamble)); err != nil {
			return nil, err
		}
		if err := readAck(c); err != nil {
			return nil, err
		}
		return c, nil
	}
	tc := tls.Client(c, t.clientTLS)
	err := tc.Handshake()
	if err == nil {
		err = t.checkServer(tc.ConnectionState(), peer)
	}
	if err == nil {
		err = readAck(tc)
	}
	if err != nil {
		if tlsutil.IsAuthError(err) {
			t.log.Warn().Str("peer", string(peer)).Str("remote", addr).Err(err).Msg("refused: peer not authenticated, or it refused us")
			return nil, fmt.Errorf("%w: %s at %s: %v", transport.ErrUnauthenticated, peer, addr, err)
		}
		return nil, err
	}
	return tlsOut{tc: tc, raw: c}, nil
}

// checkServer checks that the server's certificate names the peer we
// meant to reach and that it speaks our protocol.
func (t *Transport) checkServer(cs tls.ConnectionState, peer transport.PeerID) error {
	name, err := t.cfg.Identity.PeerName(cs)
	if err != nil {
		return err
	}
	if name != string(peer) {
		return fmt.Errorf("%w: certificate names %q, want %q", tlsutil.ErrWrongPeer, name, peer)
	}
	if cs.NegotiatedProtocol != ALPN {
		return fmt.Errorf("peer negotiated protocol %q, want %q", cs.NegotiatedProtocol, ALPN)
	}
	return nil
}
