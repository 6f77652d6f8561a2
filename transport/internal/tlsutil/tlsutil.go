// Package tlsutil holds what the tcp transport and the shared-memory path
// share of their TLS handshakes over a stream socket: the first byte read
// back in front of the handshake, and which failures are about
// certificates.
package tlsutil

import (
	"crypto/tls"
	"errors"
	"net"

	"github.com/gyre-ml/gyre/internal/secret"
)

// PrefixConn gives back the byte a server read to tell TLS clients from
// plain ones, before the rest of the connection.
type PrefixConn struct {
	net.Conn
	First byte
	done  bool
}

func (c *PrefixConn) Read(p []byte) (int, error) {
	if !c.done && len(p) > 0 {
		c.done = true
		p[0] = c.First
		return 1, nil
	}
	return c.Conn.Read(p)
}

// ErrWrongPeer is a server whose certificate names another peer than the
// one dialled.
var ErrWrongPeer = errors.New("wrong peer")

// IsAuthError reports whether a failed client handshake was about
// certificates: ours refused by the server (it sends an alert, which
// crypto/tls reports as a "remote error"), or the server's not trusted by
// us, or the server being another peer than the one dialled. Anything
// else (a peer closing or restarting mid-handshake) is worth a retry.
func IsAuthError(err error) bool {
	var cv *tls.CertificateVerificationError
	var oe *net.OpError
	return errors.As(err, &cv) ||
		(errors.As(err, &oe) && oe.Op == "remote error") ||
		errors.Is(err, secret.ErrUntrusted) ||
		errors.Is(err, secret.ErrNoPeerCertificate) ||
		errors.Is(err, ErrWrongPeer)
}
