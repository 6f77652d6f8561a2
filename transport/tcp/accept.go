package tcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
)

// acceptLoop accepts connections until Close, each served in its own
// goroutine so that no client can hold up another.
func (t *Transport) acceptLoop() {
	var backoff time.Duration
	for {
		c, err := t.ln.Accept()
		if err != nil {
			if t.ctx.Err() != nil {
				return
			}
			// Out of file descriptors and the like: wait and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t.log.Warn().Err(err).Dur("retry_in", backoff).Msg("accept failed")
			select {
			case <-time.After(backoff):
			case <-t.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		t.wg.Go(func() { t.serve(c) })
	}
}

// serve authenticates one incoming connection under HandshakeTimeout,
// acknowledges it, and hands it to the core, which reads its Hello. Until
// then the connection costs its goroutine and crypto/tls's buffers,
// whatever the client sends.
func (t *Transport) serve(c net.Conn) {
	tune(c)
	remote := c.RemoteAddr().String()
	c.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	// Close interrupts a handshake in progress with a past deadline.
	stop := context.AfterFunc(t.ctx, func() { c.SetDeadline(longAgo) })
	var (
		verified transport.PeerID
		in       streams.InStream
		ack      io.Writer
		err      error
	)
	if t.cfg.Insecure {
		if err = readPreamble(c); err != nil {
			t.log.Warn().Str("remote", remote).Err(err).Msg("refused: not a Gyre client")
		}
		in, ack = newPlainIn(c), c
	} else {
		var tc *tls.Conn
		tc, verified, err = t.serveTLS(c, remote)
		in, ack = tlsIn{tc: tc, raw: c}, tc
	}
	if err == nil {
		_, err = ack.Write([]byte{ackByte})
	}
	if !stop() {
		c.Close()
		return // closed
	}
	c.SetDeadline(time.Time{})
	if err != nil {
		c.Close()
		return
	}
	t.log.Debug().Str("peer", string(verified)).Str("remote", remote).Msg("accepted connection")
	t.core.Accept(verified, in)
}

// serveTLS runs the server handshake and returns the verified peer name.
// Refusals are logged with the remote address: a refused certificate by
// the check itself (with the reason), any other failure by the handshake
// error.
func (t *Transport) serveTLS(c net.Conn, remote string) (*tls.Conn, transport.PeerID, error) {
	refused := false
	// A config per connection, so the refusal hook knows the address.
	cfg := t.cfg.Identity.ServerTLS(func(claimed string, err error) {
		refused = true
		t.refusals.Add(remote, claimed, err)
		t.log.Warn().Str("remote", remote).Str("claims", claimed).Err(err).
			Msg("refused: client certificate not issued by this cluster's CA: the cluster secrets differ")
	}, ALPN)
	// Nothing may travel server to client after the acknowledgement: the
	// dialer never reads again, and unread bytes at close make its kernel
	// reset the connection. Session tickets would be such bytes.
	cfg.SessionTicketsDisabled = true
	// A TLS connection starts with a handshake record (0x16); an insecure
	// Gyre client starts with its preamble. Tell the latter it needs
	// authentication, so its Connect fails with ErrUnauthenticated rather
	// than an unexplained close.
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		t.log.Warn().Str("remote", remote).Err(err).Msg("refused: no TLS handshake")
		return nil, "", err
	}
	if first[0] == plainPreamble[0] {
		if err := readPreamble(io.MultiReader(bytes.NewReader(first[:]), c)); err == nil {
			c.Write([]byte{nackByte})
			t.log.Warn().Str("remote", remote).Msg("refused: insecure client; this transport requires TLS")
			return nil, "", errInsecureClient
		}
	}
	tc := tls.Server(&prefixConn{Conn: c, first: first[0]}, cfg)
	err := tc.Handshake()
	var name string
	if err == nil {
		name, err = t.cfg.Identity.PeerName(tc.ConnectionState())
	}
	if err == nil && tc.ConnectionState().NegotiatedProtocol != ALPN {
		err = fmt.Errorf("client did not offer protocol %q", ALPN)
	}
	if err != nil {
		if !refused {
			t.log.Warn().Str("remote", remote).Err(err).Msg("refused: TLS handshake failed")
			if distrusted(err) {
				t.refusals.Add(remote, "", fmt.Errorf("the client does not trust this worker's certificate: %w", err))
			}
		}
		return nil, "", err
	}
	return tc, transport.PeerID(name), nil
}

// readPreamble checks an insecure client's preamble. It reads a fixed
// number of bytes, whatever the client sends.
func readPreamble(r io.Reader) error {
	var b [len(plainPreamble)]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		return err
	}
	if string(b[:]) != plainPreamble {
		return errBadPreamble
	}
	return nil
}

var (
	errBadPreamble    = errors.New("bad preamble (a TLS client on an insecure transport?)")
	errInsecureClient = errors.New("insecure client")
)

// prefixConn gives back the byte serveTLS read to tell TLS from plain
// clients before the rest of the connection.
type prefixConn struct {
	net.Conn
	first byte
	done  bool
}

func (c *prefixConn) Read(p []byte) (int, error) {
	if !c.done && len(p) > 0 {
		c.done = true
		p[0] = c.first
		return 1, nil
	}
	return c.Conn.Read(p)
}

// distrusted reports whether a server handshake failed because the client
// refused the server's certificate (TLS alert bad_certificate, 42, or
// unknown_certificate_authority, 48): a client of another cluster, which
// checks the server before it presents its own certificate.
func distrusted(err error) bool {
	var ae tls.AlertError
	if errors.As(err, &ae) {
		return ae == 42 || ae == 48
	}
	s := err.Error()
	return strings.Contains(s, "remote error: tls: bad certificate") || strings.Contains(s, "remote error: tls: unknown certificate authority")
}
