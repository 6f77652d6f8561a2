package tcp

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
	"github.com/gyre-ml/gyre/transport/internal/tlsutil"
)

// Bounds on unauthenticated clients. At most maxHandshakes handshakes
// compute at once (handshakeConn), so that a burst of them cannot take
// every core from the heartbeats; at most maxPending connections are
// accepted and not yet authenticated, and more are closed at once, so
// that a flood costs bounded memory. Legitimate bursts (every member of a
// large view opening its streams) fit.
const (
	maxHandshakes = 32
	maxPending    = 1024
	// firstByteTimeout bounds the wait for a client's first byte, within
	// HandshakeTimeout: a Gyre client writes its TLS ClientHello or its
	// preamble as soon as it connects.
	firstByteTimeout = 2 * time.Second
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
			t.flood.Refused(t.Addr(), "accept failed", func(e *zerolog.Event) *zerolog.Event { return e.Err(err).Dur("retry_in", backoff) })
			select {
			case <-time.After(backoff):
			case <-t.ctx.Done():
				return
			}
			continue
		}
		backoff = 0
		select {
		case t.pending <- struct{}{}:
		default:
			c.Close()
			t.flood.Refused(c.RemoteAddr().String(), "refused: too many connections are awaiting their handshake",
				func(e *zerolog.Event) *zerolog.Event { return e.Int("max_pending", maxPending) })
			continue
		}
		t.wg.Go(func() {
			defer func() { <-t.pending }()
			t.serve(c)
		})
	}
}

// serve authenticates one incoming connection under HandshakeTimeout,
// acknowledges it, and hands it to the core, which reads its Hello. Until
// then the connection costs its goroutine and crypto/tls's buffers,
// whatever the client sends.
func (t *Transport) serve(c net.Conn) {
	tune(c)
	remote := c.RemoteAddr().String()
	deadline := time.Now().Add(t.cfg.HandshakeTimeout)
	// A client's first bytes come at once; one that sends none soon
	// holds its pending slot only briefly.
	c.SetDeadline(time.Now().Add(min(t.cfg.firstByteTimeout, t.cfg.HandshakeTimeout)))
	raw := c
	hc := &handshakeConn{Conn: c, slots: t.handshaking, deadline: deadline, closed: t.ctx.Done()}
	defer hc.finish()
	c = hc
	// Close interrupts a handshake in progress with a past deadline.
	stop := context.AfterFunc(t.ctx, hc.abort)
	var (
		verified transport.PeerID
		in       streams.InStream
		ack      io.Writer
		err      error
	)
	if t.cfg.Insecure {
		if err = readPreamble(c); err != nil {
			t.flood.Refused(remote, "refused: not a Gyre client", func(e *zerolog.Event) *zerolog.Event { return e.Err(err) })
		}
		in, ack = newPlainIn(c, newPollConn(c, raw)), c
	} else {
		var tc *tls.Conn
		poll := newPollConn(c, raw)
		tc, verified, err = t.serveTLS(poll, remote)
		in, ack = tlsIn{tc: tc, raw: c, poll: poll}, tc
	}
	if err == nil {
		_, err = ack.Write([]byte{ackByte})
	}
	if !stop() {
		c.Close()
		return // closed
	}
	c.SetDeadline(time.Time{})
	hc.finish()
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
		t.flood.Refused(remote, "refused: client certificate not issued by this cluster's CA: the cluster secrets differ",
			func(e *zerolog.Event) *zerolog.Event { return e.Str("claims", claimed).Err(err) })
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
		t.flood.Refused(remote, "refused: no TLS handshake", func(e *zerolog.Event) *zerolog.Event { return e.Err(err) })
		return nil, "", err
	}
	if first[0] == plainPreamble[0] {
		if err := readPreamble(io.MultiReader(bytes.NewReader(first[:]), c)); err == nil {
			c.Write([]byte{nackByte})
			t.flood.Refused(remote, "refused: insecure client; this transport requires TLS", nil)
			return nil, "", errInsecureClient
		}
	}
	tc := tls.Server(&tlsutil.PrefixConn{Conn: c, First: first[0]}, cfg)
	err := tc.Handshake()
	var name string
	if err == nil {
		name, err = t.cfg.Identity.PeerName(tc.ConnectionState())
	}
	if err == nil && tc.ConnectionState().NegotiatedProtocol != ALPN {
		err = fmt.Errorf("client did not offer protocol %q", ALPN)
	}
	if err != nil {
		if floodlog.TimedOut(err) {
			t.log.Debug().Str("remote", remote).Err(err).Msg("an incoming TLS handshake timed out: the client went silent")
			return nil, "", err
		}
		if !refused {
			t.flood.Refused(remote, "refused: TLS handshake failed", func(e *zerolog.Event) *zerolog.Event { return e.Err(err) })
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

// handshakeConn is an incoming connection during its handshake. The
// handshake holds one of the transport's handshake slots while it
// computes, from the moment a read returns until the next read, and none
// while it waits for the client: a burst of handshakes takes at most
// maxHandshakes goroutines' worth of CPU, and a silent or slow client
// holds no slot. After finish it is a plain connection.
type handshakeConn struct {
	net.Conn
	slots    chan struct{}
	deadline time.Time
	closed   <-chan struct{}
	held     bool       // touched only by the serving goroutine, before finish
	started  bool       // the client's first bytes came; likewise
	mu       sync.Mutex // orders abort against the deadline's extension
	aborted  bool
	plain    atomic.Bool // finished: no slots
}

func (h *handshakeConn) Read(p []byte) (int, error) {
	if h.plain.Load() {
		return h.Conn.Read(p)
	}
	h.release()
	n, err := h.Conn.Read(p)
	if err != nil {
		return n, err
	}
	if !h.started {
		h.started = true
		h.mu.Lock()
		if !h.aborted {
			h.Conn.SetDeadline(h.deadline) // the client spoke: the whole handshake timeout applies
		}
		h.mu.Unlock()
	}
	return n, h.acquire()
}

// abort ends the handshake at once, as Close does: a past deadline that
// no later extension undoes.
func (h *handshakeConn) abort() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.aborted = true
	h.Conn.SetDeadline(longAgo)
}

// acquire waits for a slot until the handshake's deadline.
func (h *handshakeConn) acquire() error {
	wait := time.NewTimer(time.Until(h.deadline))
	defer wait.Stop()
	select {
	case h.slots <- struct{}{}:
		h.held = true
		return nil
	case <-wait.C:
		return fmt.Errorf("no handshake slot came free before the deadline (%d compute at once): %w", maxHandshakes, os.ErrDeadlineExceeded)
	case <-h.closed:
		return net.ErrClosed
	}
}

func (h *handshakeConn) release() {
	if h.held {
		h.held = false
		<-h.slots
	}
}

// finish releases the slot and makes the connection a plain one. It is
// idempotent, and called by the serving goroutine only.
func (h *handshakeConn) finish() {
	h.release()
	h.plain.Store(true)
}
