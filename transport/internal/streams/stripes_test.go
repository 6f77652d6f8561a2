package streams

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// dialLog wraps a core's Dial: it counts the links dialed and whether
// each was closed, and can make the dials after the first few fail or
// wait.
type dialLog struct {
	mu     sync.Mutex
	links  []*loggedLink
	fail   error         // returned by dials past the first
	hold   chan struct{} // if set, dials past the first wait for it to close
	waited chan struct{} // closed when a dial starts waiting on hold
}

type loggedLink struct {
	Link
	mu     sync.Mutex
	closed bool
}

func (l *loggedLink) Close() error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	return l.Link.Close()
}

func (d *dialLog) wrap(c *Config) {
	dial := c.Dial
	c.Dial = func(ctx context.Context, peer transport.PeerID, addr string) (Link, error) {
		d.mu.Lock()
		later := len(d.links) > 0
		fail, hold, waited := d.fail, d.hold, d.waited
		d.mu.Unlock()
		if later && fail != nil {
			return nil, fail
		}
		if later && hold != nil {
			close(waited)
			<-hold
		}
		l, err := dial(ctx, peer, addr)
		if err != nil {
			return nil, err
		}
		ll := &loggedLink{Link: l}
		d.mu.Lock()
		d.links = append(d.links, ll)
		d.mu.Unlock()
		return ll, nil
	}
}

// counts returns the links dialed and how many of them are closed.
func (d *dialLog) counts() (dialed, closed int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, l := range d.links {
		l.mu.Lock()
		if l.closed {
			closed++
		}
		l.mu.Unlock()
	}
	return len(d.links), closed
}

// newestGen returns the stripe count that the newest live generation of
// (from, ch) at tr announced in its Hello, and how many of its stripes
// have arrived; 0, 0 if there is none.
func newestGen(tr *Transport, from transport.PeerID, ch transport.Channel) (k, arrived int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	p := tr.peers[from]
	if p == nil || p.in[ch] == nil {
		return 0, 0
	}
	gens := p.in[ch].gens
	for i := len(gens) - 1; i >= 0; i-- {
		if g := gens[i]; g.err == nil {
			for _, s := range g.streams {
				if s != nil {
					arrived++
				}
			}
			return g.k, arrived
		}
	}
	return 0, 0
}

// stripeWriters counts the goroutines running a stripe writer. Only the
// sending core of a test starts any.
func stripeWriters() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "streams.(*stripeWriter).run(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// waitStripeWriters waits until want stripe writers run; writers told to
// stop end on their own time.
func waitStripeWriters(t *testing.T, ctx context.Context, want int) {
	t.Helper()
	for {
		got := stripeWriters()
		if got == want {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%d stripe writers run, want %d", got, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// sendRecv sends a message of n bytes from a to b on ch and checks that
// b receives it intact.
func sendRecv(t *testing.T, ctx context.Context, a, b *Transport, ch transport.Channel, seq uint64, n int) {
	t.Helper()
	msg := make([]byte, n)
	transporttest.FillPattern(msg, seq)
	hdr := wire.Header{Kind: wire.KindData, Seq: seq}
	sent := make(chan error, 1)
	go func() { sent <- a.Send(ctx, "b", ch, hdr, msg) }()
	buf := make([]byte, n+1)
	h, got, err := b.Recv(ctx, "a", ch, buf)
	if err != nil {
		t.Fatalf("Recv of %d bytes (seq %d): %v", n, seq, err)
	}
	if err := <-sent; err != nil {
		t.Fatalf("Send of %d bytes (seq %d): %v", n, seq, err)
	}
	if h.Seq != seq || got != n {
		t.Fatalf("got seq %d of %d bytes, want seq %d of %d", h.Seq, got, seq, n)
	}
	if err := transporttest.CheckPattern(buf[:n], seq); err != nil {
		t.Fatalf("seq %d: %v", seq, err)
	}
}

func TestSetStripesValidates(t *testing.T) {
	tn := newTestNet(t)
	a := tn.add(t, "a", func(c *Config) { c.Stripes = 3 })
	for ch := range transport.NumChannels {
		if got := a.Stripes(ch); got != 3 {
			t.Errorf("Stripes(%v) = %d, want Config.Stripes 3", ch, got)
		}
	}
	for _, tc := range []struct {
		ch transport.Channel
		k  int
	}{{transport.NumChannels, 2}, {transport.ChanData, 0}, {transport.ChanData, -1}, {transport.ChanData, MaxStripes + 1}} {
		if err := a.SetStripes(tc.ch, tc.k); err == nil {
			t.Errorf("SetStripes(%v, %d) accepted", tc.ch, tc.k)
		}
	}
	if err := a.SetStripes(transport.NumChannels, 2); !errors.Is(err, transport.ErrBadChannel) {
		t.Errorf("SetStripes of an unknown channel: %v, want ErrBadChannel", err)
	}
	if got := a.Stripes(transport.ChanData); got != 3 {
		t.Errorf("Stripes after refused SetStripes = %d, want 3 unchanged", got)
	}
	if got := a.Stripes(transport.NumChannels); got != 0 {
		t.Errorf("Stripes of an unknown channel = %d, want 0", got)
	}
	for _, k := range []int{1, MaxStripes} {
		if err := a.SetStripes(transport.ChanData, k); err != nil || a.Stripes(transport.ChanData) != k {
			t.Errorf("SetStripes(data, %d): %v; Stripes = %d", k, err, a.Stripes(transport.ChanData))
		}
	}
	if got := a.Stripes(transport.ChanControl); got != 3 {
		t.Errorf("SetStripes(data) changed control to %d", got)
	}
}

// TestSetStripesAcrossGenerations changes a channel's stripes between
// phases, both sides reopening it at an idle point, and checks that
// every message arrives intact, that each new generation announces the
// new count, that links are dialed only when a stripe first needs one,
// and that the writers of stripes given up stop.
func TestSetStripesAcrossGenerations(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var dials dialLog
	tn := newTestNet(t)
	a := tn.add(t, "a", dials.wrap)
	b := tn.add(t, "b", nil)
	if err := a.Connect(ctx, "b", "b"); err != nil {
		t.Fatal(err)
	}
	if n, _ := dials.counts(); n != 1 {
		t.Fatalf("Connect dialed %d links, want Config.Stripes 1", n)
	}
	const ch = transport.ChanData
	seq := uint64(0)
	maxK := 1
	for i, k := range []int{1, 4, 2, 1} {
		if i > 0 {
			a.Reopen("b", ch)
			b.Reopen("a", ch)
		}
		if err := a.SetStripes(ch, k); err != nil {
			t.Fatal(err)
		}
		// A small message opens stripe 0 alone: nothing more is dialed.
		seq++
		sendRecv(t, ctx, a, b, ch, seq, 100)
		if gk, arrived := newestGen(b, "a", ch); gk != k || arrived != 1 {
			t.Fatalf("k=%d: after a small message the generation has k=%d, %d stripes arrived; want k=%d, 1", k, gk, arrived, k)
		}
		if n, _ := dials.counts(); n != maxK {
			t.Fatalf("k=%d: %d links dialed after a small message, want %d", k, n, maxK)
		}
		for _, n := range []int{wire.StripeMin, 3*wire.StripeMin + 7, 64} {
			seq++
			sendRecv(t, ctx, a, b, ch, seq, n)
		}
		maxK = max(maxK, k)
		if gk, arrived := newestGen(b, "a", ch); gk != k || arrived != k {
			t.Fatalf("k=%d: the generation has k=%d, %d stripes arrived; want %d, %d", k, gk, arrived, k, k)
		}
		if n, closed := dials.counts(); n != maxK || closed != 0 {
			t.Fatalf("k=%d: %d links dialed, %d closed; want %d, 0", k, n, closed, maxK)
		}
		waitStripeWriters(t, ctx, k-1)
	}
	if s := a.LinkStats(); s.DialErrors != 0 || s.LinkFailures != 0 {
		t.Fatalf("LinkStats %+v, want no errors", s)
	}
}

// TestSetStripesFreshChannel: a channel's first generation takes the
// count set before its first Send, with nothing to reopen, while a
// channel already open keeps its count until it is reopened.
func TestSetStripesFreshChannel(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var dials dialLog
	tn := newTestNet(t)
	a := tn.add(t, "a", dials.wrap)
	b := tn.add(t, "b", nil)
	if err := a.Connect(ctx, "b", "b"); err != nil {
		t.Fatal(err)
	}
	sendRecv(t, ctx, a, b, transport.ChanControl, 1, 10) // control's generation: 1 stripe
	for _, ch := range []transport.Channel{transport.ChanData, transport.ChanControl} {
		if err := a.SetStripes(ch, 3); err != nil {
			t.Fatal(err)
		}
	}
	sendRecv(t, ctx, a, b, transport.ChanData, 2, 2*wire.StripeMin+1)
	if k, arrived := newestGen(b, "a", transport.ChanData); k != 3 || arrived != 3 {
		t.Fatalf("data: generation of k=%d, %d arrived; want 3, 3", k, arrived)
	}
	sendRecv(t, ctx, a, b, transport.ChanControl, 3, 2*wire.StripeMin+1)
	if k, arrived := newestGen(b, "a", transport.ChanControl); k != 1 || arrived != 1 {
		t.Fatalf("control, open before SetStripes: generation of k=%d, %d arrived; want 1, 1", k, arrived)
	}
	if n, _ := dials.counts(); n != 3 {
		t.Fatalf("%d links dialed, want 3", n)
	}
	a.Reopen("b", transport.ChanControl)
	b.Reopen("a", transport.ChanControl)
	sendRecv(t, ctx, a, b, transport.ChanControl, 4, 2*wire.StripeMin+1)
	if k, arrived := newestGen(b, "a", transport.ChanControl); k != 3 || arrived != 3 {
		t.Fatalf("control, reopened: generation of k=%d, %d arrived; want 3, 3", k, arrived)
	}
	if n, _ := dials.counts(); n != 3 {
		t.Fatalf("%d links dialed, want the 3 shared by the channels", n)
	}
}

// TestDropAfterLazyStripes: a dropped peer's links, those dialed for a
// stripe included, are closed and its stripe writers end.
func TestDropAfterLazyStripes(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	var dials dialLog
	tn := newTestNet(t)
	a := tn.add(t, "a", dials.wrap)
	b := tn.add(t, "b", nil)
	if err := a.Connect(ctx, "b", "b"); err != nil {
		t.Fatal(err)
	}
	for _, ch := range []transport.Channel{transport.ChanData, transport.ChanRecovery} {
		if err := a.SetStripes(ch, 4); err != nil {
			t.Fatal(err)
		}
		sendRecv(t, ctx, a, b, ch, 1, wire.StripeMin)
	}
	waitStripeWriters(t, ctx, 6)
	a.Drop("b", nil)
	waitStripeWriters(t, ctx, 0)
	if n, closed := dials.counts(); n != 4 || closed != 4 {
		t.Fatalf("%d links dialed, %d closed; want 4, 4", n, closed)
	}
}

// TestLazyDialFails: a link a stripe needs that cannot be dialed fails
// the Send with a PeerError and abandons the peer's links, as a broken
// link does, and counts as a dial error, not a link failure.
func TestLazyDialFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	refused := errors.New("test: refused")
	dials := dialLog{fail: refused}
	tn := newTestNet(t)
	a := tn.add(t, "a", dials.wrap)
	tn.add(t, "b", nil)
	if err := a.Connect(ctx, "b", "b"); err != nil {
		t.Fatal(err)
	}
	if err := a.SetStripes(transport.ChanData, 2); err != nil {
		t.Fatal(err)
	}
	err := a.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData}, make([]byte, wire.StripeMin))
	var pe *transport.PeerError
	if !errors.As(err, &pe) || pe.Op != "send" || !errors.Is(err, refused) {
		t.Fatalf("Send needing a link that cannot be dialed: %v, want a send PeerError wrapping the dial's", err)
	}
	if s := a.LinkStats(); s.DialErrors != 1 || s.LinkFailures != 0 {
		t.Fatalf("LinkStats %+v, want 1 dial error and no link failure", s)
	}
	if _, closed := dials.counts(); closed != 1 {
		t.Fatalf("%d of Connect's links closed, want 1: the peer's links are abandoned", closed)
	}
	if err := a.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData}, nil); !errors.Is(err, transport.ErrNotConnected) {
		t.Fatalf("Send after the failed dial: %v, want ErrNotConnected", err)
	}
	waitStripeWriters(t, ctx, 0)
}

// TestLinkDialedAfterDrop: a link whose dial ends after the peer was
// dropped is closed at once, and the Send fails with the drop's reason.
func TestLinkDialedAfterDrop(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	dials := dialLog{hold: make(chan struct{}), waited: make(chan struct{})}
	tn := newTestNet(t)
	a := tn.add(t, "a", dials.wrap)
	tn.add(t, "b", nil)
	if err := a.Connect(ctx, "b", "b"); err != nil {
		t.Fatal(err)
	}
	if err := a.SetStripes(transport.ChanData, 2); err != nil {
		t.Fatal(err)
	}
	sent := make(chan error, 1)
	go func() {
		sent <- a.Send(ctx, "b", transport.ChanData, wire.Header{Kind: wire.KindData}, make([]byte, wire.StripeMin))
	}()
	select {
	case <-dials.waited:
	case <-ctx.Done():
		t.Fatal("the Send did not dial a link for stripe 1")
	}
	reason := errors.New("test drop")
	a.Drop("b", reason)
	close(dials.hold)
	if err := <-sent; !errors.Is(err, reason) || !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("Send whose link was dialed after a Drop: %v, want a PeerError wrapping the drop's reason", err)
	}
	if n, closed := dials.counts(); n != 2 || closed != 2 {
		t.Fatalf("%d links dialed, %d closed; want 2, 2", n, closed)
	}
	waitStripeWriters(t, ctx, 0)
}
