package gyre

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Link probes measure the speed of every link of a view, so that the ring
// can be ordered to cross slow links rarely (ring.ChooseOrder). Each pair
// of members exchanges probeBytes each way on transport.ChanProbe, once
// per view: pairs meet in rounds of a round-robin tournament, every member
// in at most one pair per round, so a view of n probes in n-1 or n rounds
// and nobody's link is measured while it also carries another probe of
// the same member. The sender of each direction times it, up to the
// receiver's acknowledgement.

const (
	// probeBytes is what a probe sends each way: enough for a TCP or QUIC
	// connection to leave slow start on a LAN, little enough that a view
	// of 16 probes in about a second on a 1 Gbit/s network.
	probeBytes = 4 << 20
	// probeMessage is the size of one probe message.
	probeMessage = 256 << 10
	// probeRoundTimeout bounds one pair's exchange: a link slower than
	// about 1 MB/s is reported unknown, which ChooseOrder avoids as well.
	probeRoundTimeout = 10 * time.Second
	// minOrderedRing is the smallest view whose order matters: every ring
	// of 3 or fewer members is the same ring.
	minOrderedRing = 4
)

// reprobeEvery is how often, in iterations, a view that keeps its
// members probes its links again, so that the ring follows links whose
// speed changed (traffic of other jobs, a rerouted uplink): rarely, as a
// probe round pauses training for a few hundred milliseconds. A variable
// so that tests can shorten it.
var reprobeEvery int64 = 1000

// probeAck flags a probe's acknowledgement, as opposed to its payload.
const probeAck = 1

// arrangeRing orders the current view's ring from probes of its links
// (Config.RingOrder auto, 4 or more members): every member probes, the
// speeds are allgathered on the control channel into one table, and every
// member derives the same order from it. The order changes who passes to
// whom on the data channel, never the ranks. It runs where no collective
// is in flight: in a new view before the state broadcast, and at a
// boundary every reprobeEvery iterations.
func (w *Worker) arrangeRing(ctx context.Context) error {
	vs := w.cur
	order, err := w.probeOrder(ctx, vs)
	if err != nil || order == nil {
		return err
	}
	return vs.setOrder(order)
}

// probeOrder measures vs's links and returns the ring order they give, or
// nil if the ring keeps its order: a view smaller than minOrderedRing, or
// RingOrder not auto, is never probed.
func (w *Worker) probeOrder(ctx context.Context, vs *viewState) ([]int, error) {
	n := len(vs.ids)
	if w.cfg.RingOrder != RingOrderAuto || n < minOrderedRing {
		return nil, nil
	}
	w.fail(FailProbe)
	start := time.Now()
	table := make([]int64, n*n)
	copy(table[vs.rank*n:], w.probeLinks(ctx, vs))
	if err := ring.AllGather(ctx, vs.ctrl, table); err != nil {
		return nil, fmt.Errorf("gyre: gather the link probes: %w", err)
	}
	speed := make([][]int64, n)
	for r := range speed {
		speed[r] = table[r*n : (r+1)*n : (r+1)*n]
	}
	if e := w.log.Debug(); e.Enabled() {
		rows := make([]string, n)
		for r, row := range speed {
			rows[r] = fmt.Sprint(mbPerSec(row))
		}
		e.Strs("mb_s", rows).Msg("link speeds, a row per sender")
	}
	order := ring.ChooseOrder(speed)
	if vs.probed && slices.Equal(order, vs.order) {
		w.log.Debug().Ints("order", vs.ringOrder()).Dur("took", time.Since(start)).Msg("ring order kept after link probes")
		return nil, nil
	}
	w.log.Info().Ints("order", order).Float64("slowest_link_mb_s", slowestLink(speed, order)/1e6).
		Float64("address_order_slowest_mb_s", slowestLink(speed, ring.RankOrder(n))/1e6).Dur("took", time.Since(start)).
		Msg("ring ordered from link probes")
	return order, nil
}

// mbPerSec converts speeds in bytes per second to whole MB/s, for logs.
func mbPerSec(speed []int64) []int64 {
	out := make([]int64, len(speed))
	for i, s := range speed {
		out[i] = s / 1e6
	}
	return out
}

// slowestLink returns the slowest link of the ring through order, in
// bytes per second, taking each pair's faster direction as ChooseOrder
// does.
func slowestLink(speed [][]int64, order []int) float64 {
	slowest := int64(-1)
	for i, a := range order {
		b := order[(i+1)%len(order)]
		if s := max(speed[a][b], speed[b][a]); slowest < 0 || s < slowest {
			slowest = s
		}
	}
	return float64(slowest)
}

// probeLinks measures this worker's send speed to every other member of
// vs, in bytes per second by rank (0 for itself and for a link whose probe
// failed, which is logged).
func (w *Worker) probeLinks(ctx context.Context, vs *viewState) []int64 {
	n := len(vs.ids)
	speed := make([]int64, n)
	buf := make([]byte, probeMessage)
	for round := range probeRounds(n) {
		peer := probePartner(n, vs.rank, round)
		if peer < 0 {
			continue
		}
		p := prober{t: w.t, peer: vs.ids[peer], buf: buf,
			hdr: wire.Header{Kind: wire.KindProbe, Epoch: vs.view.Epoch, Seq: uint64(w.iter), Step: uint32(round)}}
		rctx, cancel := context.WithTimeout(ctx, probeRoundTimeout)
		s, err := p.exchange(rctx, vs.rank < peer)
		cancel()
		if err != nil {
			w.log.Warn().Err(err).Int("peer_rank", peer).Str("peer", string(vs.ids[peer])).
				Msg("link probe failed; the ring avoids the link")
			continue
		}
		speed[peer] = s
	}
	return speed
}

// probeRounds is the number of rounds of n members' round-robin
// tournament.
func probeRounds(n int) int {
	if n < 2 {
		return 0
	}
	return n + n%2 - 1
}

// probePartner returns rank's partner in round k of probeRounds(n), or -1
// if it sits the round out (n odd). It is the circle method: with m
// players (n, plus a bye when n is odd), player m-1 meets player k, and
// every other player i meets the j with i+j ≡ 2k (mod m-1).
func probePartner(n, rank, k int) int {
	m := n + n%2
	var p int
	switch rank {
	case m - 1:
		p = k
	case k:
		p = m - 1
	default:
		p = ((2*k-rank)%(m-1) + m - 1) % (m - 1)
	}
	if p >= n {
		return -1
	}
	return p
}

// prober runs one pair's exchange on ChanProbe. Messages of another
// probe (a different epoch, generation or round: the leftovers of an
// exchange cut off by its deadline) are skipped.
type prober struct {
	t    transport.Transport
	peer transport.PeerID
	hdr  wire.Header // Kind, Epoch, Seq (generation) and Step (round)
	buf  []byte
}

// exchange probes both directions, this side's first if first, and
// returns this side's send speed in bytes per second.
func (p prober) exchange(ctx context.Context, first bool) (int64, error) {
	if first {
		speed, err := p.send(ctx)
		if err != nil {
			return 0, err
		}
		return speed, p.receive(ctx)
	}
	if err := p.receive(ctx); err != nil {
		return 0, err
	}
	return p.send(ctx)
}

// send sends probeBytes and times them up to the acknowledgement.
func (p prober) send(ctx context.Context) (int64, error) {
	start := time.Now()
	for i := range probeBytes / probeMessage {
		h := p.hdr
		h.Chunk = uint32(i)
		if err := p.t.Send(ctx, p.peer, transport.ChanProbe, h, p.buf); err != nil {
			return 0, fmt.Errorf("gyre: probe %s: %w", p.peer, err)
		}
	}
	if err := p.await(ctx, probeAck); err != nil {
		return 0, err
	}
	elapsed := max(time.Since(start), time.Microsecond)
	return int64(float64(probeBytes) / elapsed.Seconds()), nil
}

// receive takes the peer's probeBytes and acknowledges them.
func (p prober) receive(ctx context.Context) error {
	for range probeBytes / probeMessage {
		if err := p.await(ctx, 0); err != nil {
			return err
		}
	}
	h := p.hdr
	h.Flags = probeAck
	if err := p.t.Send(ctx, p.peer, transport.ChanProbe, h, nil); err != nil {
		return fmt.Errorf("gyre: acknowledge the probe of %s: %w", p.peer, err)
	}
	return nil
}

// await reads the next message of this exchange with the given flags,
// skipping those of other probes.
func (p prober) await(ctx context.Context, flags uint8) error {
	for {
		h, _, err := p.t.Recv(ctx, p.peer, transport.ChanProbe, p.buf)
		if err != nil {
			return fmt.Errorf("gyre: probe of %s: %w", p.peer, err)
		}
		if h.Kind == wire.KindProbe && h.Epoch == p.hdr.Epoch && h.Seq == p.hdr.Seq && h.Step == p.hdr.Step {
			if h.Flags != flags {
				return fmt.Errorf("gyre: probe of %s out of step: flags %d, want %d", p.peer, h.Flags, flags)
			}
			return nil
		}
	}
}

// ringOrder returns the view's ring order as ranks, rank order if none
// was chosen.
func (vs *viewState) ringOrder() []int {
	if vs.order == nil {
		return ring.RankOrder(len(vs.ids))
	}
	return slices.Clone(vs.order)
}

// setOrder runs vs's ring in order, one that its link probes chose.
func (vs *viewState) setOrder(order []int) error {
	if err := vs.data.SetOrder(order); err != nil {
		return err
	}
	vs.order, vs.probed = order, true
	return nil
}
