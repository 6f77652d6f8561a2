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
type pollConn struct {
	net.Conn
	rc       syscall.RawConn
	until    time.Time
	deadline atomic.Int64 // the read deadline in Unix nanoseconds, 0 for none
}

// newPollConn returns c with polling reads on raw, its TCP socket, or nil
// if raw has no file descriptor to poll.
func newPollConn(c, raw net.Conn) *pollConn {
	sc, ok := raw.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	return &pollConn{Conn: c, rc: rc}
}

func (p *pollConn) Read(b []byte) (int, error) {
	if p.until.IsZero() || len(b) == 0 {
		return p.Conn.Read(b)
	}
	var (
		n     int
		err   error
		slept bool
	)
	rerr := p.rc.Read(func(fd uintptr) bool {
		for {
			n, err = syscall.Read(int(fd), b)
			switch {
			case err == syscall.EINTR:
				continue
			case err != syscall.EAGAIN:
				return true
			case slept:
				return false // woken with nothing to read: sleep again
			}
			now := time.Now()
			if d := p.deadline.Load(); now.After(p.until) || d != 0 && now.UnixNano() >= d {
				slept = true
				return false
			}
		}
	})
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
// (d <= 0). p may be nil: no polling.
func (p *pollConn) setPoll(d time.Duration) {
	switch {
	case p == nil:
	case d > 0:
		p.until = time.Now().Add(d)
	default:
		p.until = time.Time{}
	}
}
