package linkbench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"

	"github.com/quic-go/quic-go"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/sockbuf"
	gquic "github.com/gyre-ml/gyre/transport/quic"
)

// bareALPN is the protocol the bare QUIC and TLS baselines negotiate:
// Gyre's own, so the handshakes match.
const bareALPN = gquic.ALPN

// bareQUICConfig mirrors the quic transport's flow-control windows (a
// quarter of the maximum to start, auto-tuned up to it), so the baseline
// differs from Gyre only by the framing.
func bareQUICConfig() *quic.Config {
	return &quic.Config{
		InitialStreamReceiveWindow:     gquic.DefaultStreamWindow / 4,
		MaxStreamReceiveWindow:         gquic.DefaultStreamWindow,
		InitialConnectionReceiveWindow: gquic.DefaultConnWindow / 4,
		MaxConnectionReceiveWindow:     gquic.DefaultConnWindow,
		MaxIdleTimeout:                 gquic.DefaultIdleTimeout,
		KeepAlivePeriod:                gquic.DefaultKeepAlive,
	}
}

// udpSocket binds a UDP socket on loopback with the large buffers the quic
// transport asks for, so neither side loses packets the other would not.
func udpSocket() (*net.UDPConn, error) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		return nil, err
	}
	// A refusal only costs throughput, on both sides of the comparison alike.
	sockbuf.Grow(c, sockbuf.Size)
	return c, nil
}

// bareListener accepts bare connections of one kind. accept returns as soon
// as a connection arrives; the returned open finishes the handshake, so one
// slow client cannot hold up the accept loop.
type bareListener interface {
	accept(ctx context.Context) (open func(context.Context) (conn, error), err error)
	addr() string
	close() error
}

func listenBare(kind BareKind, id *secret.Identity) (bareListener, error) {
	switch kind {
	case BareQUIC:
		udp, err := udpSocket()
		if err != nil {
			return nil, fmt.Errorf("bench: bare quic listen: %w", err)
		}
		qt := &quic.Transport{Conn: udp}
		l, err := qt.Listen(id.ServerTLS(nil, bareALPN), bareQUICConfig())
		if err != nil {
			qt.Close()
			udp.Close()
			return nil, fmt.Errorf("bench: bare quic listen: %w", err)
		}
		return quicListener{l: l, qt: qt, udp: udp}, nil
	case BareTLS, BareTCP:
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("bench: bare %s listen: %w", kind, err)
		}
		tl := tcpListener{l: l}
		if kind == BareTLS {
			tl.tls = id.ServerTLS(nil, bareALPN)
		}
		return tl, nil
	}
	return nil, fmt.Errorf("bench: unknown baseline %q", kind)
}

// dialBare opens one bare connection. A QUIC connection is dialed from qt,
// the one socket of its bareLink, as the quic transport dials all its
// stripes from one socket.
func dialBare(ctx context.Context, kind BareKind, addr string, id *secret.Identity, qt *quic.Transport) (conn, error) {
	switch kind {
	case BareQUIC:
		ua, err := net.ResolveUDPAddr("udp", addr)
		if err != nil {
			return nil, fmt.Errorf("bench: bare quic dial: %w", err)
		}
		qc, err := qt.Dial(ctx, ua, id.ClientTLS(bareALPN), bareQUICConfig())
		if err != nil {
			return nil, fmt.Errorf("bench: bare quic dial: %w", err)
		}
		s, err := qc.OpenStreamSync(ctx)
		if err != nil {
			qc.CloseWithError(0, "")
			return nil, fmt.Errorf("bench: bare quic stream: %w", err)
		}
		return quicConn{Stream: s, conn: qc}, nil
	case BareTLS:
		d := tls.Dialer{Config: id.ClientTLS(bareALPN)}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("bench: bare tls dial: %w", err)
		}
		return c.(*tls.Conn), nil
	case BareTCP:
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("bench: bare tcp dial: %w", err)
		}
		return c.(*net.TCPConn), nil
	}
	return nil, fmt.Errorf("bench: unknown baseline %q", kind)
}

type quicListener struct {
	l   *quic.Listener
	qt  *quic.Transport
	udp *net.UDPConn
}

func (q quicListener) addr() string { return q.udp.LocalAddr().String() }
func (q quicListener) close() error {
	return errors.Join(q.l.Close(), q.qt.Close(), q.udp.Close())
}

func (q quicListener) accept(ctx context.Context) (func(context.Context) (conn, error), error) {
	qc, err := q.l.Accept(ctx)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) (conn, error) {
		// The stream shows up with the parent's first command.
		s, err := qc.AcceptStream(ctx)
		if err != nil {
			qc.CloseWithError(0, "")
			return nil, err
		}
		return quicConn{Stream: s, conn: qc}, nil
	}, nil
}

// quicConn is a QUIC stream that closes its whole connection.
type quicConn struct {
	*quic.Stream
	conn *quic.Conn
}

func (q quicConn) Close() error { return q.conn.CloseWithError(0, "") }

type tcpListener struct {
	l   net.Listener
	tls *tls.Config // nil for plain TCP
}

func (t tcpListener) addr() string { return t.l.Addr().String() }
func (t tcpListener) close() error { return t.l.Close() }

func (t tcpListener) accept(ctx context.Context) (func(context.Context) (conn, error), error) {
	stop := context.AfterFunc(ctx, func() { t.l.Close() })
	defer stop()
	c, err := t.l.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	return func(ctx context.Context) (conn, error) {
		if t.tls == nil {
			return c.(*net.TCPConn), nil
		}
		tc := tls.Server(c, t.tls)
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, err
		}
		return tc, nil
	}, nil
}
