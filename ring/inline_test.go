package ring

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

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

// spy records the goroutine of every Send, and the poll of every Recv
// (transport.WithPoll). It hides the transport's SendBufferer; buffered
// adds one.
type spy struct {
	transport.Transport
	mu    sync.Mutex
	sends map[uint64]int
	polls map[time.Duration]int
}

func (s *spy) Recv(ctx context.Context, id transport.PeerID, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	s.mu.Lock()
	if s.polls != nil {
		s.polls[transport.PollFrom(ctx)]++
	}
	s.mu.Unlock()
	return s.Transport.Recv(ctx, id, ch, buf)
}

// polled returns how many Recvs since the last call polled for d, and
// how many for any other duration (0 included).
func (s *spy) polled(d time.Duration) (with, without int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for p, k := range s.polls {
		if p == d {
			with += k
		} else {
			without += k
		}
	}
	s.polls = map[time.Duration]int{}
	return with, without
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

// checkInlineOrder replays walkInline's order on the plans of one
// collective: when receive j comes up, the send it waits for (After) has
// been issued, and every send is issued by the end. With sends that never
// block, an inline collective then never waits on itself. checkStructure
// runs it, so it sees every plan TestCollectives simulates (every world
// size, kind, length and chunk size of its table but chunks of 1 and 2
// elements at n = 64's long lengths), TestLarge's and the fuzzer's.
func checkInlineOrder(tb testing.TB, k kind, ps []Plan) {
	tb.Helper()
	for r, p := range ps {
		i := 0
		for j, x := range p.Recvs {
			for i < len(p.Sends) && p.Sends[i].After < j {
				i++
			}
			if x.After >= i {
				tb.Fatalf("%s n=%d length=%d chunk=%d rank %d: receive %d waits for send %d, not issued before it",
					k.name, len(ps), p.Length, p.ChunkElems, r, j, x.After)
			}
		}
		for i < len(p.Sends) && p.Sends[i].After < len(p.Recvs) {
			i++
		}
		if i != len(p.Sends) {
			tb.Fatalf("%s n=%d length=%d chunk=%d rank %d: send %d is never issued", k.name, len(ps), p.Length, p.ChunkElems, r, i)
		}
	}
}

// rendezvous makes every Send wait until the peer has begun a Recv from
// this sender, as a transport whose buffers are full does, while it
// claims a large SendBuffer: inline collectives' sends then block, and
// only the hand-off to the second walker (checkStall) lets them finish.
type rendezvous struct {
	transport.Transport
	self transport.PeerID
	net  *rendezvousNet
}

type rendezvousNet struct {
	mu      sync.Mutex
	cond    *sync.Cond
	credits map[[2]transport.PeerID]int // (receiver, sender): Recvs begun, not yet used by a Send
}

func (r rendezvous) SendBuffer() int { return 1 << 30 }

func (r rendezvous) Send(ctx context.Context, id transport.PeerID, ch transport.Channel, h wire.Header, p []byte) error {
	n := r.net
	key := [2]transport.PeerID{id, r.self}
	n.mu.Lock()
	for n.credits[key] == 0 {
		if ctx.Err() != nil {
			n.mu.Unlock()
			return ctx.Err()
		}
		n.cond.Wait()
	}
	n.credits[key]--
	n.mu.Unlock()
	return r.Transport.Send(ctx, id, ch, h, p)
}

func (r rendezvous) Recv(ctx context.Context, id transport.PeerID, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	n := r.net
	n.mu.Lock()
	n.credits[[2]transport.PeerID{r.self, id}]++
	n.cond.Broadcast()
	n.mu.Unlock()
	return r.Transport.Recv(ctx, id, ch, buf)
}

// rendezvousComms makes n Comms over a rendezvous network, each with a
// 10 s collective timeout: without the hand-off every inline collective
// would time out. Until ctx ends, blocked sends are woken now and then
// to look at their contexts.
func rendezvousComms(t *testing.T, ctx context.Context, n int) []*Comm {
	t.Helper()
	cl := newCluster(t, n, nil)
	rn := &rendezvousNet{credits: map[[2]transport.PeerID]int{}}
	rn.cond = sync.NewCond(&rn.mu)
	comms := make([]*Comm, n)
	for r := range n {
		cfg := testConfig(t, cl.ids, r)
		cfg.CollectiveTimeout = 10 * time.Second
		c, err := NewComm(rendezvous{Transport: cl.trs[r], self: cl.ids[r], net: rn}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		comms[r] = c
	}
	go func() {
		for ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
			rn.cond.Broadcast()
		}
		rn.cond.Broadcast()
	}()
	return comms
}

// TestInlineSendStallsHandOver runs small collectives over a transport
// whose sends block until the peer receives, though it claims to buffer
// them: every rank's first send blocks, and the collectives still finish,
// correct, once the receives move to the second walker, which happens
// once per plan, not at every collective.
func TestInlineSendStallsHandOver(t *testing.T) {
	for _, n := range []int{2, 3, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			comms := rendezvousComms(t, ctx, n)
			rng := rand.New(rand.NewPCG(uint64(n), 5))
			for range 3 { // the first runs with both walkers, the others inline
				testAllReduce[float32](t, comms, rng, wire.OpSum, 256)
				mustAll(t, each(comms, func(r int, c *Comm) error { return c.Barrier(ctx) }))
			}
			if ctx.Err() != nil {
				t.Fatal("the collectives outlasted their 20 s")
			}
			// A rank's plan stalls at most once (the allreduce, and the
			// barrier if it still fits): a stall is remembered, not paid
			// every time. A rank whose partner handed off first may never
			// stall, but some rank must.
			total := 0
			for r, c := range comms {
				total += c.handoffs
				if c.handoffs > 2 {
					t.Errorf("rank %d: %d hand-offs in 3 rounds of 2 collectives, want at most 2", r, c.handoffs)
				}
			}
			if total == 0 {
				t.Error("no rank handed off: the test no longer makes inline sends block")
			}
		})
	}
}

// TestInlineStallThenMismatch: ranks that disagree about a small
// collective's length, with every inline send stalled and handed off,
// fail with ErrMismatch, not a broken stream, and the Comms stay usable.
func TestInlineStallThenMismatch(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	comms := rendezvousComms(t, ctx, 2)
	rng := rand.New(rand.NewPCG(2, 9))
	testAllReduce[float32](t, comms, rng, wire.OpSum, 256) // both walkers: a new Comm
	for r, err := range each(comms, func(r int, c *Comm) error {
		return AllReduce(ctx, c, wire.OpSum, make([]float32, 256+r))
	}) {
		if !errors.Is(err, ErrMismatch) {
			t.Fatalf("rank %d: got %v, want ErrMismatch", r, err)
		}
	}
	if comms[0].handoffs+comms[1].handoffs == 0 {
		t.Fatal("no rank handed off: the mismatch was not met after a hand-off")
	}
	testAllReduce[float32](t, comms, rng, wire.OpSum, 256)
	testAllReduce[float32](t, comms, rng, wire.OpSum, 256)
}

// TestInlineCollectivesPoll: after SetPoll, the receives of inline
// collectives pass the poll to the transport, and those of collectives
// too large to run inline do not; SetPoll(0) turns it off.
func TestInlineCollectivesPoll(t *testing.T) {
	const n, poll = 3, 30 * time.Microsecond
	cl := newCluster(t, n, nil)
	spies := make([]*spy, n)
	comms := make([]*Comm, n)
	for r := range n {
		spies[r] = &spy{Transport: cl.trs[r], sends: map[uint64]int{}, polls: map[time.Duration]int{}}
		c, err := NewComm(buffered{spies[r], 16 << 10}, testConfig(t, cl.ids, r))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		comms[r] = c
	}
	allreduce := func(floats int) {
		t.Helper()
		mustAll(t, each(comms, func(r int, c *Comm) error {
			return AllReduce(context.Background(), c, wire.OpSum, make([]float32, floats))
		}))
	}
	allreduce(1024) // the first collective of a Comm never runs inline
	mustAll(t, each(comms, func(r int, c *Comm) error { return c.SetPoll(poll) }))
	for _, tc := range []struct {
		name   string
		floats int
		polls  bool
	}{
		{"4KiB", 1024, true},
		{"64KiB", 16 << 10, false}, // over inlineMax
		{"4KiB-again", 1024, true},
	} {
		for r := range n {
			spies[r].polled(poll) // forget earlier receives
		}
		allreduce(tc.floats)
		for r := range n {
			with, without := spies[r].polled(poll)
			if tc.polls && (with == 0 || without != 0) || !tc.polls && with != 0 {
				t.Errorf("%s, rank %d: %d receives polled for %v and %d did not; want polling %v", tc.name, r, with, poll, without, tc.polls)
			}
		}
	}
	mustAll(t, each(comms, func(r int, c *Comm) error { return c.SetPoll(0) }))
	allreduce(1024)
	for r := range n {
		if with, _ := spies[r].polled(poll); with != 0 {
			t.Errorf("after SetPoll(0), rank %d: %d receives polled", r, with)
		}
	}
}
