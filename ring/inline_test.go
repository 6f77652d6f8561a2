package ring

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// goid returns the calling goroutine's id, from its stack header.
func goid() uint64 {
	var b [64]byte
	s := b[:runtime.Stack(b[:], false)]
	s = bytes.TrimPrefix(s, []byte("goroutine "))
	id, _ := strconv.ParseUint(string(s[:bytes.IndexByte(s, ' ')]), 10, 64)
	return id
}

// spy records the goroutine of every Send. It hides the transport's
// SendBufferer; buffered adds one.
type spy struct {
	transport.Transport
	mu    sync.Mutex
	sends map[uint64]int
}

func (s *spy) Send(ctx context.Context, id transport.PeerID, ch transport.Channel, h wire.Header, p []byte) error {
	s.mu.Lock()
	s.sends[goid()]++
	s.mu.Unlock()
	return s.Transport.Send(ctx, id, ch, h, p)
}

// sentOn reports whether every Send since the last reset ran on goroutine
// g, and resets.
func (s *spy) sentOn(g uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	only := len(s.sends) == 1 && s.sends[g] > 0
	s.sends = map[uint64]int{}
	return only
}

type buffered struct {
	*spy
	size int
}

func (b buffered) SendBuffer() int { return b.size }

// TestSmallCollectivesRunInline checks when a collective's sends run on
// the caller's goroutine: only when everything it sends to a peer fits
// the transport's send buffer, and only once no peer may hold leftovers.
func TestSmallCollectivesRunInline(t *testing.T) {
	const n = 4
	for _, tc := range []struct {
		name   string
		buffer int // -1: a transport without SendBufferer
		bytes  int
		inline bool
	}{
		{"4KiB", 16 << 10, 4 << 10, true},
		{"4KiB/no-buffer", -1, 4 << 10, false},
		{"4KiB/small-buffer", 8 << 10, 4 << 10, false}, // half the buffer: the frame header does not fit
		{"64KiB/over-cap", 1 << 30, 64 << 10, false},   // inlineMax, whatever the transport
		{"empty", 16 << 10, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl := newCluster(t, n, nil)
			spies := make([]*spy, n)
			comms := make([]*Comm, n)
			for r := range n {
				spies[r] = &spy{Transport: cl.trs[r], sends: map[uint64]int{}}
				var tr transport.Transport = spies[r]
				if tc.buffer >= 0 {
					tr = buffered{spies[r], tc.buffer}
				}
				c, err := NewComm(tr, testConfig(t, cl.ids, r))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				comms[r] = c
			}
			bufs := make([][]float32, n)
			for r := range bufs {
				bufs[r] = make([]float32, tc.bytes/4)
				for i := range bufs[r] {
					bufs[r][i] = float32(r + 1)
				}
			}
			callers := make([]uint64, n)
			allreduce := func() {
				t.Helper()
				mustAll(t, each(comms, func(r int, c *Comm) error {
					callers[r] = goid()
					return AllReduce(context.Background(), c, wire.OpSum, bufs[r])
				}))
			}
			allreduce() // a new Comm's peers may hold leftovers: never inline
			for r := range n {
				if spies[r].sentOn(callers[r]) {
					t.Errorf("rank %d ran its first collective inline", r)
				}
			}
			allreduce()
			for r := range n {
				if got := spies[r].sentOn(callers[r]); got != tc.inline {
					t.Errorf("rank %d: sends on the caller's goroutine = %v, want %v", r, got, tc.inline)
				}
				for i, v := range bufs[r] {
					if want := float32(n * (n + 1) / 2 * n); v != want {
						t.Fatalf("rank %d: element %d = %v after two allreduces, want %v", r, i, v, want)
					}
				}
			}
			if !tc.inline {
				return
			}
			// A failed collective (every rank's context ended) may leave
			// messages queued: the next runs with both walkers, the one
			// after inline again.
			cancelled, cancel := context.WithCancel(context.Background())
			cancel()
			for r, err := range each(comms, func(r int, c *Comm) error {
				return AllReduce(cancelled, c, wire.OpSum, bufs[r])
			}) {
				if err == nil {
					t.Fatalf("rank %d: an allreduce with a cancelled context succeeded", r)
				}
			}
			for _, want := range []bool{false, true} {
				allreduce()
				for r := range n {
					if got := spies[r].sentOn(callers[r]); got != want {
						t.Errorf("after a failure, rank %d: sends on the caller's goroutine = %v, want %v", r, got, want)
					}
				}
			}
		})
	}
}
