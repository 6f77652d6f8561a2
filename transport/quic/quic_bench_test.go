package quic

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// The benchmarks pair each Gyre measurement with a bare quic-go baseline:
// the same bytes on plain quic-go streams, with the same TLS, windows and
// socket buffers and the same layout (one connection per direction and
// stripe, one unidirectional stream on each) but no Gyre framing, hello or
// core. The difference is what Gyre costs.

var (
	benchSizes   = []int{4 << 10, 1 << 20, 64 << 20}
	benchStripes = []int{1, 2, 4}
)

func BenchmarkOneWay(b *testing.B) {
	for _, k := range benchStripes {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("stripes=%d/%s", k, transporttest.SizeName(size)), func(b *testing.B) {
				nodes := newNodes(func(c *Config) { c.Stripes = k })(b, 2)
				transporttest.BenchmarkOneWay(b, nodes, size)
			})
		}
	}
}

func BenchmarkRoundTrip(b *testing.B) {
	for _, k := range benchStripes {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("stripes=%d/%s", k, transporttest.SizeName(size)), func(b *testing.B) {
				nodes := newNodes(func(c *Config) { c.Stripes = k })(b, 2)
				transporttest.BenchmarkRoundTrip(b, nodes, size)
			})
		}
	}
}

// BenchmarkBareOneWay streams size bytes per op from one endpoint to the
// other over k connections, each carrying size/k bytes on one stream.
func BenchmarkBareOneWay(b *testing.B) {
	for _, k := range benchStripes {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("stripes=%d/%s", k, transporttest.SizeName(size)), func(b *testing.B) {
				ctx := benchContext(b)
				src, dst := barePair(b)
				pairs := make([]uniPair, k)
				for i := range pairs {
					pairs[i] = src.uni(b, ctx, dst)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				n := b.N
				b.ResetTimer()
				done := make(chan error, 2*k)
				for i, p := range pairs {
					part := size / k
					if i == k-1 {
						part = size - part*(k-1)
					}
					go func() { done <- writeN(p.send, part, n) }()
					go func() { done <- readN(p.recv, part, n) }()
				}
				for range 2 * k {
					if err := <-done; err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkBareRoundTrip measures a 4 KiB ping-pong: one op is 4 KiB there
// and its echo back.
func BenchmarkBareRoundTrip(b *testing.B) {
	const size = 4 << 10
	ctx := benchContext(b)
	a, c := barePair(b)
	there, back := a.uni(b, ctx, c), c.uni(b, ctx, a)
	n := b.N
	echoed := make(chan error, 1)
	go func() {
		buf := make([]byte, size)
		for range n {
			if _, err := io.ReadFull(there.recv, buf); err != nil {
				echoed <- err
				return
			}
			if _, err := back.send.Write(buf); err != nil {
				echoed <- err
				return
			}
		}
		echoed <- nil
	}()
	p, buf := make([]byte, size), make([]byte, size)
	b.ReportAllocs()
	b.ResetTimer()
	for range n {
		if _, err := there.send.Write(p); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(back.recv, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if err := <-echoed; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkBareBidirectional has both endpoints stream size bytes per op to
// each other at once, as the two ring neighbours of an N=2 allreduce do.
// The rate reported is per direction. With conns=2 each direction has its
// own connection, as in Gyre; with conns=1 both share one.
func BenchmarkBareBidirectional(b *testing.B) {
	for _, conns := range []int{1, 2} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("conns=%d/%s", conns, transporttest.SizeName(size)), func(b *testing.B) {
				ctx := benchContext(b)
				x, y := barePair(b)
				var there, back uniPair
				if conns == 2 {
					there, back = x.uni(b, ctx, y), y.uni(b, ctx, x)
				} else {
					there, back = x.duplex(b, ctx, y)
				}
				b.SetBytes(int64(size))
				b.ReportAllocs()
				n := b.N
				b.ResetTimer()
				done := make(chan error, 4)
				for _, p := range []uniPair{there, back} {
					go func() { done <- writeN(p.send, size, n) }()
					go func() { done <- readN(p.recv, size, n) }()
				}
				for range 4 {
					if err := <-done; err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

func benchContext(b *testing.B) context.Context {
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	b.Cleanup(cancel)
	return ctx
}

// writeN writes n chunks of size bytes to w.
func writeN(w io.Writer, size, n int) error {
	p := make([]byte, size)
	for range n {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// readN reads n chunks of size bytes from r.
func readN(r io.Reader, size, n int) error {
	p := make([]byte, min(size, 1<<20))
	for total := int64(size) * int64(n); total > 0; {
		m, err := r.Read(p[:min(int64(len(p)), total)])
		total -= int64(m)
		if err != nil && total > 0 {
			return err
		}
	}
	return nil
}

// bareEnd is a bare quic-go endpoint set up as a Transport sets itself up.
type bareEnd struct {
	qt *quicgo.Transport
	ln *quicgo.Listener
	id *secret.Identity

	mu    sync.Mutex
	conns []*quicgo.Conn
}

// uniPair is one stream between two bare endpoints.
type uniPair struct {
	send *quicgo.SendStream
	recv *quicgo.ReceiveStream
}

// barePair returns two bare endpoints of one cluster on 127.0.0.1.
func barePair(b *testing.B) (*bareEnd, *bareEnd) {
	ca := transporttest.NewCA(b)
	return newBareEnd(b, ca, "bare-0"), newBareEnd(b, ca, "bare-1")
}

func newBareEnd(b *testing.B, ca *secret.CA, name string) *bareEnd {
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		b.Fatal(err)
	}
	setSocketBuffers(udp, zerolog.Nop())
	e := &bareEnd{qt: &quicgo.Transport{Conn: udp}, id: transporttest.Issue(b, ca, name)}
	// Both sides accept streams, so that conns=1 can carry both directions.
	e.ln, err = e.qt.Listen(e.id.ServerTLS(nil, ALPN), bareConfig())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		e.mu.Lock()
		for _, c := range e.conns {
			c.CloseWithError(0, "")
		}
		e.mu.Unlock()
		e.ln.Close()
		e.qt.Close()
		udp.Close()
	})
	return e
}

func bareConfig() *quicgo.Config {
	return Config{}.withDefaults().quicConfig(false)
}

func (e *bareEnd) track(c *quicgo.Conn) {
	e.mu.Lock()
	e.conns = append(e.conns, c)
	e.mu.Unlock()
}

// connect dials a new connection from e to to and returns both ends.
func (e *bareEnd) connect(b *testing.B, ctx context.Context, to *bareEnd) (mine, theirs *quicgo.Conn) {
	mine, err := e.qt.Dial(ctx, to.ln.Addr(), e.id.ClientTLS(ALPN), bareConfig())
	if err != nil {
		b.Fatal(err)
	}
	e.track(mine)
	theirs, err = to.ln.Accept(ctx)
	if err != nil {
		b.Fatal(err)
	}
	to.track(theirs)
	return mine, theirs
}

// uni dials a new connection from e to to and opens one stream on it.
func (e *bareEnd) uni(b *testing.B, ctx context.Context, to *bareEnd) uniPair {
	mine, theirs := e.connect(b, ctx, to)
	return openUni(b, ctx, mine, theirs)
}

// duplex dials one connection from e to to and opens a stream each way.
func (e *bareEnd) duplex(b *testing.B, ctx context.Context, to *bareEnd) (there, back uniPair) {
	mine, theirs := e.connect(b, ctx, to)
	return openUni(b, ctx, mine, theirs), openUni(b, ctx, theirs, mine)
}

// openUni opens a stream from one end of a connection and accepts it at
// the other. A byte is sent first, since a peer sees a stream only once
// data arrives on it.
func openUni(b *testing.B, ctx context.Context, from, to *quicgo.Conn) uniPair {
	s, err := from.OpenUniStreamSync(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := s.Write([]byte{1}); err != nil {
		b.Fatal(err)
	}
	r, err := to.AcceptUniStream(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(r, make([]byte, 1)); err != nil {
		b.Fatal(err)
	}
	return uniPair{send: s, recv: r}
}
