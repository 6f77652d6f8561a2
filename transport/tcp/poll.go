package tcp

import (
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// pollConn is an accepted connection whose reads can poll the socket
// before they sleep (transport.WithPoll, through streams.Poller). With no
// poll set it reads through c, the connection as the handshake left it.
// SetPoll(d) gives the reads until d from now: a read that finds no bytes
// reads the socket again, without blocking, until then, and then waits in
// the runtime's poller as any read does. A read deadline (a cancelled
// Recv) ends the polling at once, so a cancelled Recv still returns with
// nothing read. until is touched only by the goroutine reading the stream.
// Without a file descriptor (rc nil) it never polls.
type pollConn struct {
	net.Conn
	rc       syscall.RawConn // nil: raw had no file descriptor
	until    time.Time
	deadline atomic.Int64 // the read deadline in Unix nanoseconds, 0 for none

	// The state of the Read in progress, for poll, which rc.Read calls
	// back: bound once (pollFn), so that a polled read does not allocate.
	buf    []byte
	n      int
	err    error
	slept  bool
	pollFn func(fd uintptr) bool
}

// newPollConn returns c with polling reads on raw, its TCP socket.
func newPollConn(c, raw net.Conn) *pollConn {
	p := &pollConn{Conn: c}
	if sc, ok := raw.(syscall.Conn); ok {
		p.rc, _ = sc.SyscallConn()
	}
	p.pollFn = p.poll
	return p
}

func (p *pollConn) Read(b []byte) (int, error) {
	if p.until.IsZero() || p.rc == nil || len(b) == 0 {
		return p.Conn.Read(b)
	}
	p.buf, p.n, p.err, p.slept = b, 0, nil, false
	rerr := p.rc.Read(p.pollFn)
	n, err := p.n, p.err
	p.buf, p.err = nil, nil
	switch {
	case rerr != nil:
		return 0, rerr
	case err != nil:
		return 0, &net.OpError{Op: "read", Net: "tcp", Source: p.LocalAddr(), Addr: p.RemoteAddr(), Err: err}
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// poll reads fd without blocking until bytes, an error or EOF come, or
// the poll's end or the read deadline passes; then it returns false, and
// rc.Read sleeps until fd is readable and calls it again.
func (p *pollConn) poll(fd uintptr) bool {
	for {
		p.n, p.err = syscall.Read(int(fd), p.buf)
		switch {
		case p.err == syscall.EINTR:
			continue
		case p.err != syscall.EAGAIN:
			return true
		case p.slept:
			return false // woken with nothing to read: sleep again
		}
		now := time.Now()
		if d := p.deadline.Load(); now.After(p.until) || d != 0 && now.UnixNano() >= d {
			p.slept = true
			return false
		}
	}
}

// SetReadDeadline sets the socket's read deadline, and the one the
// polling loop checks.
func (p *pollConn) SetReadDeadline(t time.Time) error {
	d := int64(0)
	if !t.IsZero() {
		d = t.UnixNano()
	}
	p.deadline.Store(d)
	return p.Conn.SetReadDeadline(t)
}

// setPoll gives p's reads until d from now to poll, or ends their polling
// (d <= 0).
func (p *pollConn) setPoll(d time.Duration) {
	p.until = time.Time{}
	if d > 0 {
		p.until = time.Now().Add(d)
	}
}
