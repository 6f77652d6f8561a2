package quic

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	quicgo "github.com/quic-go/quic-go"

	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
)

// dial opens one QUIC connection to peer at addr and checks that the
// certificate it presents names peer. The core calls it once per stripe.
func (t *Transport) dial(ctx context.Context, peer transport.PeerID, addr string) (streams.Link, error) {
	ctx, cancel := context.WithTimeout(ctx, t.cfg.HandshakeTimeout)
	defer cancel()
	ua, err := resolveUDP(ctx, addr)
	if err != nil {
		return nil, err
	}
	conn, err := t.qt.Dial(ctx, ua, t.cfg.Identity.ClientTLS(ALPN), t.cfg.quicConfig(true))
	if err != nil {
		if why := certFailure(err); why != "" {
			t.log.Warn().Str("peer", string(peer)).Str("remote", addr).Err(err).Msg(why)
			return nil, fmt.Errorf("%w: %s at %s: %v", transport.ErrUnauthenticated, peer, addr, err)
		}
		return nil, err
	}
	name, err := t.cfg.Identity.PeerName(conn.ConnectionState().TLS)
	if err == nil && name != string(peer) {
		err = fmt.Errorf("certificate names %q", name)
	}
	if err != nil {
		conn.CloseWithError(codeUnauthenticated, "unexpected peer")
		t.log.Warn().Str("peer", string(peer)).Str("remote", addr).Err(err).Msg("refused: wrong peer")
		return nil, fmt.Errorf("%w: %s at %s: %v", transport.ErrUnauthenticated, peer, addr, err)
	}
	t.log.Debug().Str("peer", string(peer)).Str("remote", addr).Msg("dialed")
	return &link{conn: conn}, nil
}

// certFailure says why a dial failed in the TLS handshake, or returns ""
// if it failed otherwise. A TLS failure is a CRYPTO_ERROR carrying the TLS
// alert (RFC 9001 section 4.8): raised here when the peer's certificate
// does not verify, or sent by the peer when it refuses ours.
func certFailure(err error) string {
	var te *quicgo.TransportError
	if errors.As(err, &te) && te.ErrorCode.IsCryptoError() {
		if te.Remote {
			return "refused by peer: it does not trust our certificate"
		}
		return "refused: peer certificate not issued by this cluster"
	}
	var ce *tls.CertificateVerificationError
	if errors.As(err, &ce) {
		return "refused: peer certificate not issued by this cluster"
	}
	return ""
}

// resolveUDP resolves addr, honouring ctx for a DNS lookup.
func resolveUDP(ctx context.Context, addr string) (*net.UDPAddr, error) {
	if ap, err := netip.ParseAddrPort(addr); err == nil {
		return net.UDPAddrFromAddrPort(ap), nil
	}
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("quic: address %q: %w", addr, err)
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("quic: address %q: bad port", addr)
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("quic: resolve %q: %w", addr, err)
	}
	return net.UDPAddrFromAddrPort(netip.AddrPortFrom(ips[0].Unmap(), uint16(port))), nil
}

// link is one dialed QUIC connection. It carries only streams this side
// opens: the peer sends to us on connections it dialed itself, so each
// direction has its own connection, congestion controller and quic-go
// run loop, and the two directions proceed on different cores.
type link struct{ conn *quicgo.Conn }

func (l *link) OpenStream(ctx context.Context, _ transport.Channel) (streams.Stream, error) {
	s, err := l.conn.OpenUniStreamSync(ctx)
	if err != nil {
		return nil, err
	}
	return sendStream{s}, nil
}

func (l *link) Close() error { return l.conn.CloseWithError(codeClosed, "closed") }

// sendStream is an outbound stream. Close resets the stream rather than
// finishing it: it must unblock a Write stuck on flow control, which
// SendStream.Close may not be called concurrently with.
type sendStream struct{ s *quicgo.SendStream }

func (s sendStream) Write(p []byte) (int, error) { return s.s.Write(p) }

func (s sendStream) Close() error {
	s.s.CancelWrite(codeStreamClosed)
	return nil
}

// recvStream is an inbound stream. Close stops reading and tells the
// sender to stop.
type recvStream struct{ *quicgo.ReceiveStream }

func (s recvStream) Close() error {
	s.CancelRead(codeStreamClosed)
	return nil
}
