package tcp

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/gyre-ml/gyre/transport"
)

// ackByte is what the server sends once it has accepted a connection
// (after the TLS handshake and its certificate check, or after the plain
// preamble). It makes a refusal visible to the dialer at once.
const ackByte = 0x06

// nackByte is what a TLS server answers an insecure client before closing:
// authentication is required.
const nackByte = 0x15

// plainPreamble opens every insecure connection, before the server's
// acknowledgement, so an insecure dialer and a TLS server (or the other way
// round) fail fast instead of each waiting for the other to speak.
const plainPreamble = "GYRE-PLAIN/1\n"

// longAgo is a deadline in the past: it makes a blocked call return.
var longAgo = time.Unix(1, 0)

// tune sets socket options on a new connection. TCP_NODELAY is Go's
// default and is what small messages need: a Send is one or two writes,
// and Nagle would hold the last segment back for an ACK. Socket buffers
// are left to the kernel's autotuning: fixed 1 and 4 MiB buffers (which
// turn autotuning off) measured no better on loopback, within the run to
// run noise of a shared 2-core machine.
func tune(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
}

// tlsOut is an outbound TLS stream. Close closes the socket directly
// rather than calling tls.Conn.Close, which sends close_notify under a 5 s
// write deadline and so could block on a peer that has stopped reading.
// The receiver sees EOF at a record boundary, which tls reports as io.EOF.
type tlsOut struct {
	tc  *tls.Conn
	raw net.Conn
}

func (s tlsOut) Write(p []byte) (int, error) { return s.tc.Write(p) }
func (s tlsOut) Close() error                { return s.raw.Close() }

// tlsIn is an inbound TLS stream; Close closes the socket, as for tlsOut.
// crypto/tls reads the socket through poll.
type tlsIn struct {
	tc   *tls.Conn
	raw  net.Conn
	poll *pollConn
}

func (s tlsIn) SetPoll(d time.Duration) { s.poll.setPoll(d) }

func (s tlsIn) Read(p []byte) (int, error)           { return s.tc.Read(p) }
func (s tlsIn) SetReadDeadline(d time.Time) error    { return s.poll.SetReadDeadline(d) }
func (s tlsIn) Close() error                         { return s.raw.Close() }
func (s tlsIn) ConnectionState() tls.ConnectionState { return s.tc.ConnectionState() }

// plainInBuf is the read buffer of an inbound plain-TCP stream. A frame
// header and a small payload then cost one read syscall instead of two,
// which is a quarter of a small message's round trip on loopback; larger
// payloads bypass the buffer (bufio reads straight into a destination at
// least this large), so at most this much per frame is copied twice. TLS
// streams need no buffer: crypto/tls decrypts whole records into its own.
const plainInBuf = 8 << 10

// plainIn is an inbound plain-TCP stream, read through poll.
type plainIn struct {
	c    net.Conn
	r    *bufio.Reader
	poll *pollConn
}

func newPlainIn(c net.Conn, poll *pollConn) plainIn {
	return plainIn{c: c, r: bufio.NewReaderSize(poll, plainInBuf), poll: poll}
}

func (s plainIn) SetPoll(d time.Duration) { s.poll.setPoll(d) }

func (s plainIn) Read(p []byte) (int, error)        { return s.r.Read(p) }
func (s plainIn) SetReadDeadline(d time.Time) error { return s.poll.SetReadDeadline(d) }
func (s plainIn) Close() error                      { return s.c.Close() }

// readAck reads the server's acknowledgement.
func readAck(r io.Reader) error {
	var b [1]byte
	if _, err := io.ReadFull(r, b[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("peer closed the connection before accepting it: %w", err)
		}
		return fmt.Errorf("waiting for the peer to accept the connection: %w", err)
	}
	switch b[0] {
	case ackByte:
		return nil
	case nackByte:
		return fmt.Errorf("%w: the peer requires TLS; this transport is insecure", transport.ErrUnauthenticated)
	}
	return fmt.Errorf("peer answered %#02x, not a Gyre acknowledgement", b[0])
}
