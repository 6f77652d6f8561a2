package ring

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// watchTransport registers, as the real transports do, a
// context.AfterFunc on every distinct Done channel it is handed. The
// callback waits until the Comm receives again, so that the next
// collective has begun, and then checks the context contract: once Done
// is closed, Err stays non-nil.
type watchTransport struct {
	transport.Transport
	recvs atomic.Int64
	mu    sync.Mutex
	seen  map[<-chan struct{}]bool
	wg    sync.WaitGroup
	// closing ends the callbacks' waits: no collective follows.
	closing chan struct{}
	// broken counts contexts whose Err was nil after Done closed.
	broken, fired atomic.Int64
}

func (w *watchTransport) watch(ctx context.Context) {
	d := ctx.Done()
	if d == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.seen[d] {
		return
	}
	w.seen[d] = true
	w.wg.Add(1)
	context.AfterFunc(ctx, func() {
		defer w.wg.Done()
		w.fired.Add(1)
		n := w.recvs.Load()
		for w.recvs.Load() == n {
			select {
			case <-w.closing:
				return
			case <-time.After(time.Millisecond):
			}
		}
		if ctx.Err() == nil {
			w.broken.Add(1)
		}
	})
}

func (w *watchTransport) Send(ctx context.Context, p transport.PeerID, ch transport.Channel, h wire.Header, b []byte) error {
	w.watch(ctx)
	return w.Transport.Send(ctx, p, ch, h, b)
}

func (w *watchTransport) Recv(ctx context.Context, p transport.PeerID, ch transport.Channel, b []byte) (wire.Header, int, error) {
	w.watch(ctx)
	w.recvs.Add(1)
	return w.Transport.Recv(ctx, p, ch, b)
}

// TestCancelledContextStaysCancelled reproduces the panic "context:
// internal error: missing cancel error": a collective is cancelled while
// the transport watches its context with context.AfterFunc, and the next
// collective begins before the callback's goroutine reads Err. A context
// handed to the transport must keep a non-nil Err once its Done is
// closed, whatever the Comm does next. With SetPoll, the receives'
// context must follow each new view.
func TestCancelledContextStaysCancelled(t *testing.T) {
	for _, poll := range []time.Duration{0, 20 * time.Microsecond} {
		t.Run(fmt.Sprint("poll=", poll), func(t *testing.T) { testCancelledContext(t, poll) })
	}
}

func testCancelledContext(t *testing.T, poll time.Duration) {
	cl := newCluster(t, 2, nil)
	for _, c := range cl.comms {
		c.Close()
	}
	w := &watchTransport{Transport: cl.trs[0], seen: map[<-chan struct{}]bool{}, closing: make(chan struct{})}
	cl.trs[0] = w
	comms := cl.newComms(t, cl.ids, nil)
	if err := comms[0].SetPoll(poll); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Millisecond)
		// Rank 1 is not there yet: rank 0 waits until its context ends.
		err := AllReduce(ctx, comms[0], wire.OpSum, make([]float32, 10))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("rank 0: got %v, want context.DeadlineExceeded", err)
		}
		// Rank 1 runs the collective rank 0 gave up on (it fails on
		// rank 0's abort marker), then both run the next one.
		_ = AllReduce(t.Context(), comms[1], wire.OpSum, make([]float32, 10))
		mustAll(t, each(comms, func(r int, c *Comm) error {
			return AllReduce(t.Context(), c, wire.OpSum, make([]float32, 10))
		}))
	}
	close(w.closing)
	for _, c := range comms {
		c.Close()
	}
	w.wg.Wait()
	if w.fired.Load() < 20 {
		t.Fatalf("%d callbacks ran, want at least one per cancelled collective (20)", w.fired.Load())
	}
	if n := w.broken.Load(); n > 0 {
		t.Fatalf("%d contexts handed to the transport had a nil Err after their Done closed", n)
	}
}

// pollRecorder is a transport that records the longest poll any Recv
// was asked for (transport.WithPoll).
type pollRecorder struct {
	transport.Transport
	longest atomic.Int64
}

func (p *pollRecorder) Recv(ctx context.Context, peer transport.PeerID, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	if d := int64(transport.PollFrom(ctx)); d > p.longest.Load() {
		p.longest.Store(d)
	}
	return p.Transport.Recv(ctx, peer, ch, buf)
}

// TestPollAllLargeCollectives: a collective too large to run inline
// polls its receives only with SetPollAll, and still sums right.
func TestPollAllLargeCollectives(t *testing.T) {
	for _, all := range []bool{false, true} {
		cl := newCluster(t, 2, nil)
		recs := make([]*pollRecorder, 2)
		for r := range cl.trs {
			recs[r] = &pollRecorder{Transport: cl.trs[r]}
			cl.trs[r] = recs[r]
		}
		comms := cl.newComms(t, cl.ids, nil)
		for _, c := range comms {
			if err := c.SetPoll(50 * time.Microsecond); err != nil {
				t.Fatal(err)
			}
			if err := c.SetPollAll(all); err != nil {
				t.Fatal(err)
			}
		}
		bufs := [][]float32{make([]float32, 1<<18), make([]float32, 1<<18)}
		for r := range bufs {
			for i := range bufs[r] {
				bufs[r][i] = float32(r + 1)
			}
		}
		mustAll(t, each(comms, func(r int, c *Comm) error { return AllReduce(t.Context(), c, wire.OpSum, bufs[r]) }))
		if bufs[0][0] != 3 || bufs[1][len(bufs[1])-1] != 3 {
			t.Fatalf("sums %v and %v, want 3", bufs[0][0], bufs[1][len(bufs[1])-1])
		}
		for r, rec := range recs {
			if polled := rec.longest.Load() > 0; polled != all {
				t.Errorf("SetPollAll(%v): rank %d's receives of 1 MiB polled: %v", all, r, polled)
			}
		}
		comms[0].Close()
		if err := comms[0].SetPollAll(false); !errors.Is(err, ErrClosed) {
			t.Fatalf("SetPollAll on a closed Comm = %v, want ErrClosed", err)
		}
	}
}
