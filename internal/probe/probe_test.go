package probe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
	"github.com/gyre-ml/gyre/transport/tcp"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// TestProbePartners: in the probe tournament every pair of members meets
// exactly once, partners agree, and nobody has two partners in a round.
func TestProbePartners(t *testing.T) {
	for n := 1; n <= 17; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			met := map[[2]int]int{}
			for k := range probeRounds(n) {
				for r := range n {
					p := probePartner(n, r, k)
					switch {
					case p == -1:
						continue
					case p < 0 || p >= n || p == r:
						t.Fatalf("round %d: rank %d's partner is %d", k, r, p)
					case probePartner(n, p, k) != r:
						t.Fatalf("round %d: rank %d meets %d, who meets %d", k, r, p, probePartner(n, p, k))
					}
					if r < p {
						met[[2]int{r, p}]++
					}
				}
			}
			if want := n * (n - 1) / 2; len(met) != want {
				t.Fatalf("%d pairs met, want %d", len(met), want)
			}
			for pair, times := range met {
				if times != 1 {
					t.Fatalf("pair %v met %d times", pair, times)
				}
			}
		})
	}
}

// probePair returns two probers of one exchange, a and b, over a mem
// network whose links both ways are l.
func probePair(t *testing.T, l mem.Link) (a, b prober) {
	t.Helper()
	net := mem.NewNetwork(1)
	ids := []transport.PeerID{"a", "b"}
	trs := make([]*mem.Transport, 2)
	for i, id := range ids {
		tr, err := net.Join(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs[i] = tr
	}
	for i, tr := range trs {
		if err := tr.Connect(t.Context(), ids[1-i], string(ids[1-i])); err != nil {
			t.Fatal(err)
		}
	}
	net.SetLink(ids[0], ids[1], l)
	net.SetLink(ids[1], ids[0], l)
	hdr := wire.Header{Kind: wire.KindProbe, Epoch: 3, Seq: 7, Step: 1}
	mk := func(i int) prober {
		return prober{t: trs[i], peer: ids[1-i], hdr: hdr, buf: make([]byte, stripedMessage), rbuf: make([]byte, stripedMessage),
			single: bulk{ack: probeAck, size: probeMessage}}
	}
	return mk(0), mk(1)
}

// TestProbeExchange: two sides of a probe measure a speed and a latency
// that follow the link, skipping a leftover of an earlier round, with and
// without the striped bulk probe after the single one (whose speed
// follows the link too); a side whose peer never shows up fails by its
// deadline, and leaves no goroutine behind.
func TestProbeExchange(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const delay = 5 * time.Millisecond
	for _, striped := range []bool{false, true} {
		a, b := probePair(t, mem.Link{Delay: delay})
		if striped {
			a.striped, b.striped = true, true
		}
		stale := a.hdr
		stale.Step = 0 // an earlier round's payload, cut off by its deadline
		if err := b.t.Send(t.Context(), b.peer, transport.ChanProbe, stale, b.buf[:100]); err != nil {
			t.Fatal(err)
		}
		type result struct {
			speeds  speeds
			latency time.Duration
			err     error
		}
		res := make([]result, 2)
		var wg sync.WaitGroup
		for i, p := range []prober{a, b} {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				res[i].speeds, res[i].latency, res[i].err = p.exchange(ctx, i == 0)
			})
		}
		wg.Wait()
		// Every message waits delay, so probeBytes take at least one
		// delay: a speed above probeBytes/delay would be wrong.
		most := int64(float64(probeBytes) / delay.Seconds())
		for i, r := range res {
			if r.err != nil {
				t.Fatalf("striped %v, side %d: %v", striped, i, r.err)
			}
			if s := r.speeds.single; s <= 0 || s > most {
				t.Errorf("striped %v, side %d: speed %d B/s, want above 0 and at most %d", striped, i, s, most)
			}
			if s := r.speeds.striped; striped && (s <= 0 || s > most) || !striped && s != 0 {
				t.Errorf("striped %v, side %d: striped speed %d B/s", striped, i, s)
			}
			if r.latency < delay || r.latency > 20*delay {
				t.Errorf("side %d: latency %v over a link that delays %v", i, r.latency, delay)
			}
		}
	}

	lone, _ := probePair(t, mem.Link{})
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, _, err := lone.exchange(ctx, true); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a probe with no peer: %v, want the deadline", err)
	}
}

// TestCPUShares: ranks alone on their host, or no more than its CPUs,
// get a whole core; four ranks on a 2-CPU host get half of one each; a
// rank whose quota is a quarter core gets that; ranks pinned to 4 cores
// each of a 64-CPU host get a whole one; unknown figures limit nothing.
// TestAllShared: the shared-memory chunk needs every rank's every link
// on shared memory; one rank that reached a peer otherwise, or reported
// nothing, keeps the default.
func TestAllShared(t *testing.T) {
	tb := newTable(3)
	for r := range 3 {
		tb.tail(r)[allShared] = 1
	}
	if !tb.allShared() {
		t.Fatal("every rank on shared memory: allShared false")
	}
	tb.tail(2)[allShared] = 0
	if tb.allShared() {
		t.Fatal("rank 2 off shared memory: allShared true")
	}
}

func TestCPUShares(t *testing.T) {
	hosts := []string{"10.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "127.0.0.1", "10.0.0.3", "10.0.0.3", "10.0.0.4", "10.0.0.4"}
	usable := []int64{8000, 2000, 2000, 2000, 2000, 250, 0, 4000, 4000}
	online := []int64{8000, 2000, 2000, 2000, 2000, 2000, 0, 64000, 64000}
	want := []float64{1, 0.5, 0.5, 0.5, 0.5, 0.25, 1, 1, 1}
	if got := cpuShares(hosts, usable, online); !slices.Equal(got, want) {
		t.Errorf("shares %v, want %v", got, want)
	}
	// Through the table: two ranks on one 1-CPU host see half their
	// bf16 rates, and the float32 reduction rate is left alone.
	tb := newTable(2)
	for r := range 2 {
		row := tb.tail(r)
		row[rateReduce], row[rateEncode], row[rateDecode] = 8e9, 2e9, 4e9
		row[coresUsable], row[coresOnline] = 1000, 1000
	}
	p := tb.probes([]string{"h", "h"})
	if p.Reduce[0] != 8e9 || p.Encode[1] != 1e9 || p.Decode[0] != 2e9 {
		t.Errorf("probes: reduce %v, encode %v, decode %v", p.Reduce, p.Encode, p.Decode)
	}

	// Boot ids group ranks by machine, over their addresses: four
	// network namespaces of one 2-CPU machine share its cores, and two
	// machines behind one address do not.
	tb = newTable(4)
	for r := range 4 {
		row := tb.tail(r)
		row[coresUsable], row[coresOnline] = 2000, 2000
		row[machineID] = machineHash("boot-a")
	}
	if got := tb.cpuShares([]string{"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"}); !slices.Equal(got, []float64{0.5, 0.5, 0.5, 0.5}) {
		t.Errorf("four namespaces of one machine: shares %v, want half a core each", got)
	}
	tb.tail(1)[machineID] = machineHash("boot-b")
	tb.tail(2)[machineID] = machineHash("boot-c")
	tb.tail(3)[machineID] = 0 // unknown: grouped by its address
	if got := tb.cpuShares([]string{"nat", "nat", "10.0.0.3", "10.0.0.3"}); !slices.Equal(got, []float64{1, 1, 1, 1}) {
		t.Errorf("four machines, two behind one address: shares %v, want a core each", got)
	}
	if machineHash("") != 0 || machineHash("x") == 0 {
		t.Errorf("machineHash: %d for none, %d for one", machineHash(""), machineHash("x"))
	}
}

// TestProbePlan: every pair of members is probed exactly once; no rank is
// in two pairs of a round; where ranks share a machine, no two pairs of a
// round touch one machine and rounds end at a barrier; with a machine
// each (or unknown machines), the plan is the tournament without barriers.
func TestProbePlan(t *testing.T) {
	for name, machines := range map[string][]int64{
		"a machine each":    {1, 2, 3, 4, 5},
		"unknown":           {0, 0, 0, 0},
		"one machine":       {7, 7, 7, 7, 7, 7},
		"two by two":        {1, 1, 2, 2},
		"three hosts mixed": {1, 2, 2, 3, 3, 3, 0},
		"one rank":          {1},
	} {
		t.Run(name, func(t *testing.T) {
			n := len(machines)
			plan := probePlan(machines)
			shared := len(slices.Compact(slices.Sorted(slices.Values(machines)))) < n && !slices.Contains(machines, 0)
			if name == "three hosts mixed" {
				shared = true
			}
			if plan.barriers != shared {
				t.Fatalf("barriers %v with machines %v", plan.barriers, machines)
			}
			met := map[[2]int]int{}
			for k, pairs := range plan.rounds {
				ranks, used := map[int]bool{}, map[int64]bool{}
				for _, pr := range pairs {
					a, b := pr[0], pr[1]
					if a >= b || a < 0 || b >= n {
						t.Fatalf("round %d: pair %v", k, pr)
					}
					if ranks[a] || ranks[b] {
						t.Fatalf("round %d: a rank of %v is in two pairs", k, pr)
					}
					ranks[a], ranks[b] = true, true
					met[pr]++
					if !shared {
						if p := probePartner(n, a, k); p != b {
							t.Fatalf("round %d: pair %v, the tournament pairs %d with %d", k, pr, a, p)
						}
						continue
					}
					ma, mb := keyOf(machines, a), keyOf(machines, b)
					if used[ma] || used[mb] {
						t.Fatalf("round %d: pair %v shares a machine with another pair: %v", k, pr, pairs)
					}
					used[ma], used[mb] = true, true
				}
			}
			if len(met) != n*(n-1)/2 {
				t.Fatalf("%d pairs probed, want %d", len(met), n*(n-1)/2)
			}
			for pr, c := range met {
				if c != 1 {
					t.Fatalf("pair %v probed %d times", pr, c)
				}
			}
			if again := probePlan(machines); !slices.EqualFunc(again.rounds, plan.rounds, slices.Equal) {
				t.Fatalf("two plans of one table differ")
			}
		})
	}
}

func keyOf(machines []int64, r int) int64 {
	if machines[r] == 0 {
		return -int64(r) - 1
	}
	return machines[r]
}

// TestRunProbesOneMachineAtATime: four ranks on two machines, over links
// slow enough that a bulk probe takes tens of milliseconds. Run measures
// every link, and no two pairs' bulk probes touching one machine ever ran
// at once: the transport saw each rank's bulk exchange from its first
// payload to the peer's acknowledgement.
func TestRunProbesOneMachineAtATime(t *testing.T) {
	// The kernels' worker pool is the process's, started by the first
	// reduction timing.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), goleak.IgnoreTopFunction("github.com/gyre-ml/gyre/kernels.(*Pool).work"))
	const n = 4
	machines := []string{"m1", "m1", "m2", "m2"}
	net := mem.NewNetwork(1)
	ids := []transport.PeerID{"r0", "r1", "r2", "r3"}
	rec := &bulkLog{start: map[int]time.Time{}}
	trs := make([]*spyTransport, n)
	for i, id := range ids {
		tr, err := net.Join(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs[i] = &spyTransport{Transport: tr, rank: i, ids: ids, log: rec}
	}
	for i := range ids {
		for j := range ids {
			if i != j {
				net.SetLink(ids[i], ids[j], mem.Link{Rate: 200e6})
				if err := trs[i].Connect(t.Context(), ids[j], string(ids[j])); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	members := make([]vote.Member, n)
	for i, id := range ids {
		members[i] = vote.Member{ID: id, Addr: fmt.Sprintf("10.0.0.%d:1", i)}
	}
	speeds := make([][]int64, n)
	var wg sync.WaitGroup
	errs := make([]error, n)
	for r := range n {
		wg.Go(func() {
			ctrl, err := ring.NewComm(trs[r], ring.Config{Epoch: 1, Members: ids, Rank: r, Channel: transport.ChanControl})
			if err != nil {
				errs[r] = err
				return
			}
			defer ctrl.Close()
			v := &view.View{Epoch: 1, Members: members, IDs: ids, Rank: r, Ctrl: ctrl}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			tb, err := probeTable(ctx, Env{T: trs[r], Tune: true, Machine: machines[r], Log: zerolog.Nop()}, v)
			errs[r] = err
			speeds[r] = tb.row(r)[:n]
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
		for p, s := range speeds[r] {
			if p != r && (s <= 0 || s == failedProbeSpeed) {
				t.Fatalf("rank %d: speed to %d is %d", r, p, s)
			}
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.spans) != n*(n-1) {
		t.Fatalf("%d bulk exchanges seen, want %d", len(rec.spans), n*(n-1))
	}
	for i, a := range rec.spans {
		for _, b := range rec.spans[i+1:] {
			samePair := a.rank == b.peer && a.peer == b.rank
			shareMachine := machines[a.rank] == machines[b.rank] || machines[a.rank] == machines[b.peer] ||
				machines[a.peer] == machines[b.rank] || machines[a.peer] == machines[b.peer]
			if !samePair && shareMachine && a.from.Before(b.to) && b.from.Before(a.to) {
				t.Errorf("ranks %d->%d (%v to %v) and %d->%d (%v to %v) probed at once on one machine",
					a.rank, a.peer, a.from, a.to, b.rank, b.peer, b.from, b.to)
			}
		}
	}
}

// bulkLog records when each rank's bulk probe to each peer ran.
type bulkLog struct {
	mu    sync.Mutex
	start map[int]time.Time // by rank*100+peer
	spans []span
}

type span struct {
	rank, peer int
	from, to   time.Time
}

// spyTransport notes a rank's first bulk payload to a peer and the peer's
// acknowledgement of them.
type spyTransport struct {
	transport.Transport
	rank int
	ids  []transport.PeerID
	log  *bulkLog
}

func (s *spyTransport) Send(ctx context.Context, peer transport.PeerID, ch transport.Channel, hdr wire.Header, payload []byte) error {
	if ch == transport.ChanProbe && hdr.Flags == 0 && hdr.Chunk == 0 {
		s.log.mu.Lock()
		s.log.start[s.rank*100+slices.Index(s.ids, peer)] = time.Now()
		s.log.mu.Unlock()
	}
	return s.Transport.Send(ctx, peer, ch, hdr, payload)
}

func (s *spyTransport) Recv(ctx context.Context, peer transport.PeerID, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	h, n, err := s.Transport.Recv(ctx, peer, ch, buf)
	if err == nil && ch == transport.ChanProbe && h.Flags == probeAck {
		p := slices.Index(s.ids, peer)
		s.log.mu.Lock()
		s.log.spans = append(s.log.spans, span{rank: s.rank, peer: p, from: s.log.start[s.rank*100+p], to: time.Now()})
		s.log.mu.Unlock()
	}
	return h, n, err
}

// TestStripingChoice: striped links are probed only where every rank has
// a core of its own and some link is not shared memory, and chosen only
// if they make a large allreduce's ring at least stripesGain faster.
func TestStripingChoice(t *testing.T) {
	mk := func(n int, single, striped int64) table {
		tb := newTable(n)
		tb.striped = true
		for r := range n {
			row := tb.row(r)
			for j := range n {
				if j != r {
					row[j], row[n+j], row[2*n+j] = single, 100e3, striped
				}
			}
			tail := tb.tail(r)
			tail[rateReduce], tail[coresUsable], tail[coresOnline] = 10e9, 2000, 2000
			tail[machineID] = int64(r + 1)
		}
		return tb
	}
	v := &view.View{Members: []vote.Member{{ID: "a", Addr: "10.0.0.1:1"}, {ID: "b", Addr: "10.0.0.2:1"}, {ID: "c", Addr: "10.0.0.3:1"}}}
	hosts := v.Hosts()
	// The 64 MiB ring's time is nearly all bandwidth: the gain is
	// nearly the speeds' ratio.
	if tb := mk(3, 100e6, 150e6); !tb.stripingMayPay(hosts) || math.Abs(stripingGain(tb, v, false, nil)-1.5) > 0.05 {
		t.Errorf("3 machines of 2 cores, striped links 1.5x faster: may pay %v, gain %v", tb.stripingMayPay(hosts), stripingGain(tb, v, false, nil))
	}
	if g := stripingGain(mk(3, 100e6, 105e6), v, false, nil); g >= stripesGain {
		t.Errorf("striped links 1.05x faster: gain %v", g)
	}
	if g := stripingGain(mk(3, 100e6, 150e6), v, true, nil); g < stripesGain {
		t.Errorf("ordered from the probes: striped links 1.5x faster gain %v", g)
	}
	tb := mk(3, 100e6, 150e6)
	for r := range 3 {
		tb.tail(r)[machineID] = 9 // one machine of 2 cores for 3 ranks
	}
	if tb.stripingMayPay(hosts) {
		t.Errorf("3 ranks on 2 cores: striping may pay")
	}
	tb = mk(3, 100e6, 150e6)
	for r := range 3 {
		tb.tail(r)[allShared] = 1
	}
	if tb.stripingMayPay(hosts) {
		t.Errorf("every link shared memory: striping may pay")
	}
	if got := mk(3, 100e6, 150e6).withStripedSpeeds().speeds()[0][1]; got != 150e6 {
		t.Errorf("withStripedSpeeds: speed %d, want the striped 150e6", got)
	}
}

// TestStripedProbeOverSharedMemory: over transports that hold little
// unread (a shared-memory pair of tcp transports: one stripe whatever the
// probe channel asks, in a 64 KiB ring), the striped probe's messages,
// 1 MiB each way at once, still go through: neither side's send waits
// for the other to read. Both speeds are measured.
func TestStripedProbeOverSharedMemory(t *testing.T) {
	ca := transporttest.NewCA(t)
	ids := []transport.PeerID{"a", "b"}
	trs := make([]*tcp.Transport, 2)
	for i, id := range ids {
		tr, err := tcp.New(tcp.Config{ID: id, Identity: transporttest.Issue(t, ca, string(id)), Listen: "127.0.0.1:0", SharedMemory: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		if err := tr.SetStripes(transport.ChanProbe, AutoStripes); err != nil {
			t.Fatal(err)
		}
		trs[i] = tr
	}
	for i, tr := range trs {
		if err := tr.Connect(t.Context(), ids[1-i], trs[1-i].Addr()); err != nil {
			t.Fatal(err)
		}
	}
	if !trs[0].SharedMemory("b") {
		t.Skip("no shared memory between two transports of this process here")
	}
	errs, got := make([]error, 2), make([]speeds, 2)
	var wg sync.WaitGroup
	for i, tr := range trs {
		wg.Go(func() {
			p := prober{t: tr, peer: ids[1-i], hdr: wire.Header{Kind: wire.KindProbe, Epoch: 1, Seq: 1},
				buf: make([]byte, stripedMessage), rbuf: make([]byte, stripedMessage),
				single: bulk{ack: probeAck, size: wire.StripeMin / 2}, striped: true}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			got[i], _, errs[i] = p.exchange(ctx, i == 0)
		})
	}
	wg.Wait()
	for i := range trs {
		if errs[i] != nil || got[i].single <= 0 || got[i].striped <= 0 {
			t.Errorf("side %d: speeds %+v, %v", i, got[i], errs[i])
		}
	}
}

// TestProbesEndWithTheirWatch: when the watch ends the probes (a member
// fell silent), every rank returns the watch's cause, whether it was in a
// pair's exchange or waiting at the barrier that ends a round, so that
// the engine sees a lost member and recovers.
func TestProbesEndWithTheirWatch(t *testing.T) {
	const n = 4
	machines := []string{"m1", "m1", "m2", "m2"}
	net := mem.NewNetwork(1)
	ids := []transport.PeerID{"r0", "r1", "r2", "r3"}
	trs := make([]*mem.Transport, n)
	for i, id := range ids {
		tr, err := net.Join(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs[i] = tr
	}
	for i := range ids {
		for j := range ids {
			if i != j {
				net.SetLink(ids[i], ids[j], mem.Link{Rate: 50e6}) // a bulk probe takes about 80 ms
				if err := trs[i].Connect(t.Context(), ids[j], string(ids[j])); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	members := make([]vote.Member, n)
	for i, id := range ids {
		members[i] = vote.Member{ID: id, Addr: fmt.Sprintf("10.0.0.%d:1", i)}
	}
	errSilent := errors.New("a member fell silent")
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			ctrl, err := ring.NewComm(trs[r], ring.Config{Epoch: 1, Members: ids, Rank: r, Channel: transport.ChanControl})
			if err != nil {
				errs[r] = err
				return
			}
			defer ctrl.Close()
			v := &view.View{Epoch: 1, Members: members, IDs: ids, Rank: r, Ctrl: ctrl}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			watch := func(ctx context.Context) (context.Context, func()) {
				ctx, cancel := context.WithCancelCause(ctx)
				stop := time.AfterFunc(20*time.Millisecond, func() { cancel(errSilent) })
				return ctx, func() { stop.Stop(); cancel(nil) }
			}
			_, errs[r] = probeTable(ctx, Env{T: trs[r], Tune: true, Machine: machines[r], Log: zerolog.Nop(), Watch: watch}, v)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if !errors.Is(err, errSilent) {
			t.Errorf("rank %d: %v, want the watch's cause", r, err)
		}
	}
}
