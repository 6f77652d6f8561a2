package tcp

import (
	"io"
	"net"
	"syscall"
	"time"
)

// pollConn is an accepted connection whose reads can poll the socket
// before they sleep (transport.WithPoll, through streams.Poller). With no
// poll set it reads through c, the connection as the handshake left it.
// With one, a read that finds no bytes reads the socket again, without
// blocking, for up to poll, then waits in the runtime's poller as any
// read does; the read deadline (a cancelled Recv) applies from then.
// poll is touched only by the goroutine reading the stream.
type pollConn struct {
	net.Conn
	rc   syscall.RawConn
	poll time.Duration
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
	if p.poll <= 0 || len(b) == 0 {
		return p.Conn.Read(b)
	}
	var (
		n     int
		err   error
		until time.Time
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
			if until.IsZero() {
				until = now.Add(p.poll)
			} else if now.After(until) {
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

// setPoll sets the poll of p, which may be nil (no polling).
func (p *pollConn) setPoll(d time.Duration) {
	if p != nil {
		p.poll = d
	}
}
