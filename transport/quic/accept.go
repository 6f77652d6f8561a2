package quic

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"sync/atomic"

	quicgo "github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/transport"
)

// maxHandshakes bounds the incoming handshakes under way at once, so that
// a burst of them cannot take every core from the heartbeats: past it, a
// client is refused at once (its dial fails and is tried again); past
// half of it, a client must first prove its address with a Retry.
// Legitimate peers open one connection per stripe and reuse it, so they
// rarely meet the bound.
const maxHandshakes = 64

var errTooManyHandshakes = errors.New("too many handshakes under way")

// handshake is what the server knows about one incoming connection attempt.
// quic-go never reports a failed handshake to the accepting side, so it is
// tracked here, through the connection's context, in order to log refusals.
type handshake struct {
	remote   net.Addr
	accepted atomic.Bool // reached Accept
	refused  atomic.Bool // refusal already logged by the certificate check
	over     atomic.Bool // no longer counted in Transport.handshaking
}

// endHandshake stops counting h as under way; it is idempotent.
func (t *Transport) endHandshake(h *handshake) {
	if h.over.CompareAndSwap(false, true) {
		t.handshaking.Add(-1)
	}
}

type handshakeKey struct{}

// connContext runs for every incoming connection attempt, before the
// handshake. It refuses the attempt if maxHandshakes are under way. The
// context it returns ends with the connection, with the reason as its
// cause; a connection that ends before it was accepted failed its
// handshake, and that is logged with the remote address.
func (t *Transport) connContext(ctx context.Context, info *quicgo.ClientInfo) (context.Context, error) {
	if t.handshaking.Add(1) > maxHandshakes {
		t.handshaking.Add(-1)
		t.flood.Refused(info.RemoteAddr.String(), "refused: too many handshakes under way",
			func(e *zerolog.Event) *zerolog.Event { return e.Int("max_handshakes", maxHandshakes) })
		return nil, errTooManyHandshakes
	}
	h := &handshake{remote: info.RemoteAddr}
	ctx = context.WithValue(ctx, handshakeKey{}, h)
	context.AfterFunc(ctx, func() {
		t.endHandshake(h)
		if h.accepted.Load() || h.refused.Load() {
			return
		}
		cause := context.Cause(ctx)
		if floodlog.TimedOut(cause) {
			t.log.Debug().Str("remote", h.remote.String()).Err(cause).Msg("an incoming handshake timed out: the client went silent")
			return
		}
		if certFailure(cause) != "" {
			// The client refused our certificate before presenting its own:
			// a worker of another cluster. Its address is its listening
			// address, which names it.
			t.refusals.Add(h.remote.String(), "", fmt.Errorf("the client does not trust this worker's certificate: %w", cause))
		}
		t.flood.Refused(h.remote.String(), "handshake failed", func(e *zerolog.Event) *zerolog.Event { return e.Err(cause) })
	})
	return ctx, nil
}

// serverTLS returns the listener's TLS config. A config is made per
// handshake so that a refused client certificate is logged with the
// client's address.
func (t *Transport) serverTLS() *tls.Config {
	id := t.cfg.Identity
	base := id.ServerTLS(nil, ALPN)
	base.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
		var remote string
		if hello.Conn != nil {
			remote = hello.Conn.RemoteAddr().String()
		}
		h, _ := hello.Context().Value(handshakeKey{}).(*handshake)
		return id.ServerTLS(func(claimed string, err error) {
			if h != nil {
				h.refused.Store(true)
			}
			t.refusals.Add(remote, claimed, err)
			t.flood.Refused(remote, "refused: client certificate not issued by this cluster's CA: the cluster secrets differ",
				func(e *zerolog.Event) *zerolog.Event { return e.Str("claims", claimed).Err(err) })
		}, ALPN), nil
	}
	return base
}

// acceptLoop accepts connections until Close.
func (t *Transport) acceptLoop() {
	for {
		conn, err := t.ln.Accept(t.ctx)
		if err != nil {
			return
		}
		if h, ok := conn.Context().Value(handshakeKey{}).(*handshake); ok {
			h.accepted.Store(true)
			t.endHandshake(h)
		}
		t.wg.Go(func() { t.serve(conn) })
	}
}

// serve hands every unidirectional stream the peer opens on conn to the
// core, tagged with the peer name from its certificate, until the
// connection or the transport closes.
func (t *Transport) serve(conn *quicgo.Conn) {
	remote := conn.RemoteAddr().String()
	name, err := t.cfg.Identity.PeerName(conn.ConnectionState().TLS)
	if err != nil {
		// The handshake already verified the chain; this is a bug guard.
		t.log.Warn().Str("remote", remote).Err(err).Msg("refused: no verified peer name")
		conn.CloseWithError(codeUnauthenticated, "unauthenticated")
		return
	}
	peer := transport.PeerID(name)
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		conn.CloseWithError(codeClosed, "closed")
		return
	}
	t.inbound[conn] = peer
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.inbound, conn)
		t.mu.Unlock()
	}()
	t.log.Debug().Str("peer", name).Str("remote", remote).Msg("accepted")

	for {
		s, err := conn.AcceptUniStream(t.ctx)
		if err != nil {
			t.log.Debug().Str("peer", name).Str("remote", remote).Err(err).Msg("connection ended")
			return
		}
		t.core.Accept(peer, recvStream{s})
	}
}
