package shm

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
	"github.com/gyre-ml/gyre/transport/internal/tlsutil"
)

// Handshake bytes. A client of either kind opens with its preamble or a
// TLS ClientHello; the server's ack follows authentication; the client
// then sends ringByte with the memfd attached.
const (
	plainPreamble = "GYRE-SHM-PLAIN/1\n"
	ackByte       = 0x06
	nackByte      = 0x15
	ringByte      = 'R'
	// ALPN is negotiated on every TLS handshake over the socket.
	ALPN = "gyre-shm/1"
	// spareTTL bounds how long the stream a Dial authenticated waits for
	// its first use, well within the server's wait for the ring.
	spareTTL = 2 * time.Second
	// maxHandshakes bounds the handshakes computed at once, and
	// maxPending the connections accepted and not yet handed a ring;
	// more are closed at once. A burst of streams (every peer's every
	// channel and stripe) waits for a handshake slot rather than being
	// refused.
	maxHandshakes = 32
	maxPending    = 1024
)

// Local listens on an abstract Unix socket for co-located peers and dials
// theirs.
type Local struct {
	cfg       Config
	log       zerolog.Logger
	ln        *net.UnixListener
	name      string
	clientTLS *tls.Config
	slots     chan struct{} // handshakes computing
	pending   chan struct{} // connections not yet handed a ring
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	once      sync.Once
	// opened and accepted count the streams this side opened and accepted.
	opened, accepted atomic.Uint64
}

// Streams counts the streams opened to peers and accepted from them.
func (l *Local) Streams() (opened, accepted uint64) { return l.opened.Load(), l.accepted.Load() }

// Listen binds this process's abstract socket and starts accepting.
func Listen(cfg Config) (*Local, error) {
	if cfg.ID == "" || cfg.Accept == nil || (cfg.Identity == nil && !cfg.Insecure) {
		return nil, errors.New("shared memory: ID, Accept and Identity (unless Insecure) are required")
	}
	if cfg.Ring == nil {
		cfg.Ring = RingSize
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	name := SocketName(cfg.Kind, cfg.Port, cfg.ID)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: name, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("shared memory: listen on %s: %w", name, err)
	}
	l := &Local{cfg: cfg, log: cfg.Logger, ln: ln, name: name, slots: make(chan struct{}, maxHandshakes),
		pending: make(chan struct{}, maxPending)}
	if !cfg.Insecure {
		l.clientTLS = cfg.Identity.ClientTLS(ALPN)
	}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	l.wg.Go(l.acceptLoop)
	l.log.Debug().Str("socket", name).Msg("shared memory: listening")
	return l, nil
}

// Close stops accepting and waits for the handshakes under way. Streams
// already handed out are the core's to close.
func (l *Local) Close() error {
	l.once.Do(func() {
		l.cancel()
		l.ln.Close()
		l.wg.Wait()
	})
	return nil
}

func (l *Local) acceptLoop() {
	for {
		c, err := l.ln.AcceptUnix()
		if err != nil {
			if l.ctx.Err() != nil {
				return
			}
			select {
			case <-time.After(10 * time.Millisecond):
			case <-l.ctx.Done():
				return
			}
			continue
		}
		select {
		case l.pending <- struct{}{}:
		default:
			c.Close()
			l.log.Warn().Str("remote", peerProcess(c)).Int("max_pending", maxPending).
				Msg("shared memory: refused: too many connections awaiting their handshake")
			continue
		}
		l.wg.Go(func() {
			defer func() { <-l.pending }()
			l.serve(c)
		})
	}
}

// peerProcess names the process at the other end of c by its credentials.
func peerProcess(c *net.UnixConn) string {
	raw, err := c.SyscallConn()
	if err != nil {
		return "unknown process"
	}
	var cred *syscall.Ucred
	var credErr error
	err = raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err != nil || credErr != nil || cred == nil {
		return "unknown process"
	}
	return "pid " + strconv.Itoa(int(cred.Pid)) + " uid " + strconv.Itoa(int(cred.Uid))
}

// serve authenticates one incoming stream, acknowledges it, takes its
// ring and hands the stream to the core.
func (l *Local) serve(c *net.UnixConn) {
	remote := peerProcess(c)
	var nc net.Conn = c // deadlines are best effort on a socket being torn down
	nc.SetDeadline(time.Now().Add(l.cfg.HandshakeTimeout))
	stop := context.AfterFunc(l.ctx, func() { nc.SetDeadline(longAgo) })
	defer stop()
	// The handshake's computation holds a slot, the wait for the ring
	// does not.
	select {
	case l.slots <- struct{}{}:
	case <-l.ctx.Done():
		c.Close()
		return
	}
	peer, err := l.authenticate(c, remote)
	<-l.slots
	if err != nil {
		c.Close()
		return
	}
	r, err := receiveRing(c)
	if !stop() || err != nil {
		if err != nil && !errors.Is(err, io.EOF) { // EOF: a spare closed unused
			l.log.Warn().Str("peer", string(peer)).Str("remote", remote).Err(err).Msg("shared memory: no ring from an authenticated peer")
		}
		if r != nil {
			r.unmap()
		}
		c.Close()
		return
	}
	nc.SetDeadline(time.Time{})
	l.accepted.Add(1)
	l.cfg.Accept(peer, &Reader{end: end{r: r, conn: c}})
}

// authenticate runs the server side of the handshake and writes the ack.
func (l *Local) authenticate(c *net.UnixConn, remote string) (transport.PeerID, error) {
	var first [1]byte
	if _, err := io.ReadFull(c, first[:]); err != nil {
		return "", err
	}
	if l.cfg.Insecure {
		rest := make([]byte, len(plainPreamble)-1)
		if _, err := io.ReadFull(c, rest); err != nil {
			return "", err
		}
		if string(first[:])+string(rest) != plainPreamble {
			l.log.Warn().Str("remote", remote).Msg("shared memory: refused: not a Gyre client, or one that requires TLS")
			return "", errors.New("bad preamble")
		}
		_, err := c.Write([]byte{ackByte})
		return "", err // an insecure peer proves no ID; the Hello names it
	}
	if first[0] == plainPreamble[0] {
		_, _ = c.Write([]byte{nackByte}) // a courtesy to a client about to be closed
		l.refuse(remote, "", "refused: an insecure client; this worker requires TLS", errors.New("insecure client"))
		return "", errors.New("insecure client")
	}
	refused := false
	cfg := l.cfg.Identity.ServerTLS(func(claimed string, err error) {
		refused = true
		l.refuse(remote, claimed, "refused: its certificate was not issued by this cluster's CA: the cluster secrets differ", err)
	}, ALPN)
	// Nothing but the ack may travel to the client over TLS: the ring's
	// descriptor and the wake-ups follow on the bare socket.
	cfg.SessionTicketsDisabled = true
	tc := tls.Server(&tlsutil.PrefixConn{Conn: c, First: first[0]}, cfg)
	err := tc.Handshake()
	var name string
	if err == nil {
		name, err = l.cfg.Identity.PeerName(tc.ConnectionState())
	}
	if err == nil && tc.ConnectionState().NegotiatedProtocol != ALPN {
		err = fmt.Errorf("client did not offer %q", ALPN)
	}
	if err != nil {
		switch {
		case floodlog.TimedOut(err):
			l.log.Debug().Str("remote", remote).Err(err).Msg("shared memory: an incoming TLS handshake timed out: the client went silent")
		case !refused:
			l.refuse(remote, "", "refused: TLS handshake failed", err)
		}
		return "", err
	}
	_, err = tc.Write([]byte{ackByte})
	return transport.PeerID(name), err
}

func (l *Local) refuse(remote, claimed, why string, err error) {
	fields := func(e *zerolog.Event) *zerolog.Event { return e.Str("claims", claimed).Err(err) }
	if l.cfg.Flood != nil {
		l.cfg.Flood.Refused(remote, "shared memory: "+why, fields)
	} else {
		fields(l.log.Warn().Str("remote", remote)).Msg("shared memory: " + why)
	}
	if l.cfg.Refused != nil {
		l.cfg.Refused(remote, claimed, fmt.Errorf("%w: %v", transport.ErrUnauthenticated, err))
	}
}

// receiveRing reads the client's ring descriptor and maps it.
func receiveRing(c *net.UnixConn) (*region, error) {
	var b [1]byte
	oob := make([]byte, syscall.CmsgSpace(4))
	n, oobn, _, _, err := c.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, io.EOF
	}
	msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
	var fds []int
	if err == nil && len(msgs) == 1 {
		fds, err = syscall.ParseUnixRights(&msgs[0])
	}
	defer func() {
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}()
	if err != nil || b[0] != ringByte || len(fds) != 1 {
		return nil, fmt.Errorf("shared memory: expected one ring descriptor (%v)", err)
	}
	return openRegion(fds[0])
}

// longAgo is a deadline in the past: it ends a blocked call.
var longAgo = time.Unix(1, 0)

// Dial makes a Link to peer if it listens on this machine, in this
// network namespace, beside a network transport on addr's port; it fails
// with ErrNotLocal at once otherwise. The first stream is authenticated
// here, so a wrong secret fails Dial with transport.ErrUnauthenticated.
func (l *Local) Dial(ctx context.Context, peer transport.PeerID, addr string) (streams.Link, error) {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, ErrNotLocal
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return nil, ErrNotLocal
	}
	lk := &link{l: l, peer: peer, name: SocketName(l.cfg.Kind, port, peer)}
	c, err := lk.dial(ctx)
	if err != nil {
		return nil, err
	}
	lk.spare = c
	lk.timer = time.AfterFunc(spareTTL, lk.dropSpare)
	return lk, nil
}

// link opens a new socket, and ring, for every stream to one peer.
type link struct {
	l    *Local
	peer transport.PeerID
	name string

	mu     sync.Mutex
	spare  *net.UnixConn // authenticated by Dial, not yet used
	timer  *time.Timer
	closed bool
}

func (lk *link) OpenStream(ctx context.Context, ch transport.Channel) (streams.Stream, error) {
	lk.mu.Lock()
	if lk.closed {
		lk.mu.Unlock()
		return nil, net.ErrClosed
	}
	c := lk.spare
	lk.spare = nil
	lk.timer.Stop()
	lk.mu.Unlock()
	if c == nil {
		var err error
		if c, err = lk.dial(ctx); err != nil {
			return nil, err
		}
	}
	r, f, err := createRegion("gyre-ring", lk.l.cfg.Ring(ch))
	if err != nil {
		c.Close()
		return nil, err
	}
	defer f.Close() // the mapping and the peer's copy keep the memory
	if _, _, err := c.WriteMsgUnix([]byte{ringByte}, syscall.UnixRights(int(f.Fd())), nil); err != nil {
		r.unmap()
		c.Close()
		return nil, fmt.Errorf("shared memory: handing the ring to %s: %w", lk.peer, err)
	}
	lk.l.opened.Add(1)
	return &Writer{end: end{r: r, conn: c}}, nil
}

// Local says the link is shared memory (streams.Localer).
func (lk *link) Local() bool { return true }

func (lk *link) dropSpare() {
	lk.mu.Lock()
	c := lk.spare
	lk.spare = nil
	lk.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

func (lk *link) Close() error {
	lk.mu.Lock()
	lk.closed = true
	lk.timer.Stop()
	lk.mu.Unlock()
	lk.dropSpare()
	return nil
}

// dial connects to the peer's socket and runs the client handshake.
func (lk *link) dial(ctx context.Context) (*net.UnixConn, error) {
	ctx, cancel := context.WithTimeout(ctx, lk.l.cfg.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", lk.name)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return nil, ErrNotLocal
		}
		return nil, fmt.Errorf("shared memory: %w", err)
	}
	c := nc.(*net.UnixConn)
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(longAgo) })
	err = lk.handshake(c)
	if !stop() {
		c.Close()
		if err == nil || !errors.Is(err, transport.ErrUnauthenticated) {
			err = fmt.Errorf("%w (%v)", ctx.Err(), err)
		}
		return nil, err
	}
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (lk *link) handshake(c *net.UnixConn) error {
	var ack io.Reader = c
	if lk.l.cfg.Insecure {
		if _, err := c.Write([]byte(plainPreamble)); err != nil {
			return err
		}
	} else {
		tc := tls.Client(c, lk.l.clientTLS)
		err := tc.Handshake()
		if err == nil {
			var name string
			name, err = lk.l.cfg.Identity.PeerName(tc.ConnectionState())
			if err == nil && name != string(lk.peer) {
				err = fmt.Errorf("%w: certificate names %q, want %q", tlsutil.ErrWrongPeer, name, lk.peer)
			}
		}
		if err != nil {
			return lk.handshakeError(err)
		}
		ack = tc
	}
	var b [1]byte
	if _, err := io.ReadFull(ack, b[:]); err != nil {
		// In TLS 1.3 the server checks our certificate after our
		// handshake returned: its refusal is an alert on this read.
		return lk.handshakeError(fmt.Errorf("waiting for the peer to accept: %w", err))
	}
	switch b[0] {
	case ackByte:
		return nil
	case nackByte:
		return fmt.Errorf("%w: %s requires TLS; this worker is insecure", transport.ErrUnauthenticated, lk.peer)
	}
	return fmt.Errorf("shared memory: %s answered %#02x, not an acknowledgement", lk.peer, b[0])
}

// handshakeError names a failed client handshake: transport.ErrUnauthenticated
// only when it was about certificates (ours refused by the peer, or its
// not trusted by us, or another peer than the one dialed), so that a
// peer closing or restarting mid-handshake is retried, not taken for a
// worker of another cluster.
func (lk *link) handshakeError(err error) error {
	if tlsutil.IsAuthError(err) {
		return fmt.Errorf("%w: %s over shared memory: %v", transport.ErrUnauthenticated, lk.peer, err)
	}
	return fmt.Errorf("shared memory: handshake with %s: %w", lk.peer, err)
}

// Supported reports whether this build has the shared-memory path.
const Supported = true
