package membership

import (
	"bytes"
	"errors"
	"log"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
)

// maxStreams bounds the incoming gossip streams (TCP connections) that
// memberlist serves at once. Each costs a goroutine until memberlist's
// TCP timeout, whatever the client sends; past the bound a connection is
// closed at once. Members' streams (joins, state exchanges) are short, so
// a job has far fewer at once; under a flood some of theirs may be
// refused too, which gossip, a hint, tolerates.
const maxStreams = 64

// guardedTransport is memberlist's TCP and UDP transport with a bound on
// the streams it hands memberlist at once. Its methods are memberlist's,
// but StreamCh and Shutdown.
type guardedTransport struct {
	*memberlist.NetTransport
	streams chan net.Conn
	slots   chan struct{}
	flood   *floodlog.Log
	stop    chan struct{}
	wg      sync.WaitGroup
	block   func(addr string) bool // Config.Block
}

// errCut is a stream's failure to an address Config.Block cuts.
var errCut = errors.New("membership: gossip to this address is cut (Config.Block)")

// WriteToAddress sends a packet, or loses it if the address is cut.
// (memberlist calls these node-aware forms, not WriteTo and DialTimeout,
// which end in them.)
func (g *guardedTransport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if g.block != nil && g.block(a.Addr) {
		return time.Now(), nil
	}
	return g.NetTransport.WriteToAddress(b, a)
}

// DialAddressTimeout opens a stream, or fails if the address is cut.
func (g *guardedTransport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	if g.block != nil && g.block(a.Addr) {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errCut}
	}
	return g.NetTransport.DialAddressTimeout(a, timeout)
}

// newNetTransport binds memberlist's transport at host:port (port 0: any
// free port, for TCP and UDP alike) and guards it.
func newNetTransport(host string, port int, logger *log.Logger, flood *floodlog.Log, block func(string) bool) (*guardedTransport, error) {
	nc := &memberlist.NetTransportConfig{BindAddrs: []string{host}, BindPort: port, Logger: logger}
	// With port 0 the TCP and UDP binds may race other processes for the
	// same number; memberlist itself tries again, so do the same.
	tries := 1
	if port == 0 {
		tries = 10
	}
	var nt *memberlist.NetTransport
	var err error
	for range tries {
		if nt, err = memberlist.NewNetTransport(nc); err == nil || !strings.Contains(err.Error(), "address already in use") {
			break
		}
		logger.Printf("[DEBUG] memberlist: bind: %v", err)
	}
	if err != nil {
		return nil, err
	}
	g := &guardedTransport{NetTransport: nt, streams: make(chan net.Conn), slots: make(chan struct{}, maxStreams),
		flood: flood, stop: make(chan struct{}), block: block}
	g.wg.Add(1)
	go g.forward()
	return g, nil
}

// StreamCh returns the incoming streams memberlist may serve.
func (g *guardedTransport) StreamCh() <-chan net.Conn { return g.streams }

// forward passes the inner transport's streams on while fewer than
// maxStreams are being served, and closes the others at once.
func (g *guardedTransport) forward() {
	defer g.wg.Done()
	for {
		var c net.Conn
		select {
		case c = <-g.NetTransport.StreamCh():
		case <-g.stop:
			return
		}
		select {
		case g.slots <- struct{}{}:
		default:
			c.Close()
			g.flood.Refused(c.RemoteAddr().String(), "refused a gossip connection: too many are being served",
				func(e *zerolog.Event) *zerolog.Event { return e.Int("max_streams", maxStreams) })
			continue
		}
		sc := &slotConn{Conn: c, release: func() { <-g.slots }}
		select {
		case g.streams <- sc:
		case <-g.stop:
			sc.Close()
			return
		}
	}
}

// Shutdown stops the transport and the forwarding.
func (g *guardedTransport) Shutdown() error {
	err := g.NetTransport.Shutdown()
	close(g.stop)
	g.wg.Wait()
	return err
}

// slotConn is a stream that frees its slot when memberlist closes it.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// logWriter turns memberlist's log lines ("[WARN] memberlist: ...") into
// zerolog events at the matching level. Lines about input from a remote
// address ("from=...") at warning or error level, which junk sent to the
// gossip port causes one per connection or packet, go to the rate-limited
// flood log.
type logWriter struct {
	log   zerolog.Logger
	flood *floodlog.Log
	// closed drops lines once the node has shut down: memberlist's
	// suspicion timers can still fire, and a closed node has nothing to
	// say (a test's logger may be gone by then).
	closed atomic.Bool
}

// maxDetail bounds the memberlist text kept in a refusal's line.
const maxDetail = 200

var levels = []struct {
	prefix string
	level  zerolog.Level
}{{"[DEBUG]", zerolog.DebugLevel}, {"[INFO]", zerolog.InfoLevel}, {"[WARN]", zerolog.WarnLevel}, {"[ERR]", zerolog.ErrorLevel}}

func (w *logWriter) Write(p []byte) (int, error) {
	if w.closed.Load() {
		return len(p), nil
	}
	line := bytes.TrimSpace(p)
	level := zerolog.InfoLevel
	for _, l := range levels {
		if rest, ok := bytes.CutPrefix(line, []byte(l.prefix)); ok {
			level, line = l.level, bytes.TrimSpace(rest)
			break
		}
	}
	msg := string(bytes.TrimPrefix(line, []byte("memberlist: ")))
	switch {
	case strings.Contains(msg, "use of closed network connection"):
		// A probe or gossip in flight as this node shut down: not news.
		level = zerolog.DebugLevel
	case level > zerolog.InfoLevel && strings.Contains(msg, "connection refused"):
		// A member that left or died, as every member does at a job's
		// end: gossip notices, and the data plane's heartbeats, not
		// gossip, decide that a worker is lost. Not a warning.
		level = zerolog.InfoLevel
	case strings.HasPrefix(msg, "Failed fallback TCP ping"):
		// memberlist's failure detector probing a member that does not
		// answer, as a killed or stopped worker does during every
		// recovery: gossip suspects it, and the heartbeats decide.
		level = min(level, zerolog.InfoLevel)
	case strings.HasPrefix(msg, "Refuting an alive message"):
		// This node restarted under its old name, and gossip still held
		// its old self: memberlist takes the name back. Expected after a
		// restart, and the metadata bytes it quotes tell a reader nothing.
		level = zerolog.InfoLevel
		if i := strings.Index(msg, " meta:("); i >= 0 {
			msg = msg[:i] + ": gossip still held this node's previous incarnation (restarted under the same name)"
		}
	}
	if i := strings.LastIndex(msg, " from="); i >= 0 && level >= zerolog.WarnLevel {
		remote := msg[i+len(" from="):]
		// The kind is the message's fixed part: junk shows up in what
		// follows (an "unacceptable label" quotes the junk itself).
		kind := msg[:i]
		if j := strings.IndexAny(kind, `:"(`); j >= 0 {
			kind = kind[:j]
		}
		if len(msg) > maxDetail {
			msg = msg[:maxDetail] + "..."
		}
		w.flood.Refused(remote, "gossip: "+strings.TrimSpace(kind), func(e *zerolog.Event) *zerolog.Event { return e.Str("detail", msg) })
		return len(p), nil
	}
	w.log.WithLevel(level).Msg(msg)
	return len(p), nil
}
