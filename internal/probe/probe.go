// Package probe measures the links and kernels of a view: every pair of
// members times small round trips and a bulk exchange, every member times
// its reduction and bf16 kernels, and the figures, allgathered into one
// table, give every member the same ring order (ring.ChooseOrder), cost
// model (ring.FitCostModel) and small-message poll.
package probe

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"os"
	"slices"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/view"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Link probes measure every link of a view: its speed, so that the ring
// can be ordered to cross slow links rarely (ring.ChooseOrder), and its
// latency, which with the speed and the reduction rate makes the cost
// model that chooses between recursive doubling and the ring
// (ring.FitCostModel). Each pair of members times pingCount small round
// trips each way on transport.ChanProbe, then sends probeBytes both ways
// at once, once per view. Pairs meet in rounds of a round-robin
// tournament, every member in at most one pair per round, so a view of n
// members on n machines probes in n-1 or n rounds and nobody's link is
// measured while it also carries another probe of the same member.
// Members that share a machine share its cores and network interface, so
// no two pairs probe at once on one machine (probePlan). The sender of
// each direction times it, up to the receiver's acknowledgement.

const (
	// probeBytes is what a probe sends each way: enough for a TCP or QUIC
	// connection to leave slow start on a LAN, little enough that a view
	// of 16 machines probes in about a second on a 1 Gbit/s network (with
	// several workers per machine it takes more rounds: probePlan).
	probeBytes = 4 << 20
	// probeMessage is the size of one probe message: wire.StripeMin, so
	// that a pinned Config.Stripes splits it as it splits data. Under
	// Stripes auto the single probe's are half that (probeLinks).
	probeMessage = wire.StripeMin
	// stripedMessage is the size of one striped probe message: the
	// ring's pipeline chunk, split over the stripes as a chunk is.
	stripedMessage = ring.DefaultChunkBytes

	// pingCount is the number of round trips each side of a pair times
	// for the latency: the median of 16 is past a first slow one (a
	// cold path, a scheduler wakeup) and costs under a millisecond on a
	// LAN.
	pingCount = 16
	// probeRoundTimeout bounds one pair's exchange. A link whose probe
	// fails is taken at failedProbeSpeed.
	probeRoundTimeout = 10 * time.Second
	// failedProbeSpeed is the speed of a link whose probe failed: at
	// most probeBytes in probeRoundTimeout, about 0.4 MB/s. Taking it as
	// that slow, rather than unknown, makes ChooseOrder avoid the link and
	// the cost model count it as the ring's slowest.
	failedProbeSpeed = int64(probeBytes / (probeRoundTimeout / time.Second))
	// minOrderedRing is the smallest view whose order matters: every ring
	// of 3 or fewer members is the same ring.
	minOrderedRing = 4
	// reduceProbeBytes is the buffer the reduction rate is timed on: one
	// default pipeline chunk, reduced on one core as the ring reduces it.
	reduceProbeBytes = ring.DefaultChunkBytes
)

// AutoStripes is the stripes the probes try against one connection
// where striping may pay, for Env.Stripes: a bare quic-go probe of a
// 2-core machine gained 1.23x both ways from 2 connections and 1.24x
// from 4, and 1.38x and 1.47x one way.
const AutoStripes = 4

// stripesGain is how much faster striped links must make the ring for
// the data channel to be striped: past the probes' noise, as
// ring.ChooseOrder asks of a new order.
const stripesGain = 1.1

// DefaultReprobeEvery is how often, in iterations, a view that keeps its
// members probes its links again, so that the ring follows links whose
// speed changed (traffic of other jobs, a rerouted uplink): rarely, as a
// probe round pauses training for a few hundred milliseconds. Tests
// shorten it per worker.
const DefaultReprobeEvery = 1000

// Flags of probe messages: a probe's payload has none.
const (
	probeAck        = 1 // the receiver has the payload
	probePing       = 2 // a latency round trip's question
	probePong       = 3 // and its answer
	probeStriped    = 4 // a striped bulk probe's payload
	probeStripedAck = 5 // the receiver has it
	probeWarm       = 6 // the striped message each side sends before the striped probe
)

// smallPoll is how long the receives of a small collective poll before
// they sleep on a rank with a core of its own: a few round trips on
// loopback or a LAN. On this project's 2-core VM it took a 4 KiB
// allreduce of 2 ranks from 25-31 us to 9.5-11.6 us; with 4 ranks on the
// 2 cores, polling made it 1.7 times slower, hence only with a core each.
const smallPoll = 50 * time.Microsecond

// Env is what a probe needs of its worker.
type Env struct {
	T transport.Transport
	// Order says the ring is ordered from the probes (RingOrder auto);
	// Tune that the cost model and the poll come from them (Algo or
	// Compress auto, or Algo hierarchical); Always that the hierarchical
	// allreduce runs wherever it applies (Algo hierarchical).
	Order, Tune, Always bool
	// Stripes, with 2 or more, has the probes choose the data channel's
	// stripes (transport.Striper): 1, or Stripes where that makes the
	// ring at least stripesGain faster (Config.Stripes auto).
	Stripes int
	// Machine, if set, replaces this worker's machine (boot id and
	// network namespace): a test's.
	Machine string
	// Seq tells this probe's messages from an earlier one's: the
	// iteration it runs at.
	Seq uint64
	Log zerolog.Logger
	// Fail, if set, is called as the probes begin (a test's failpoint);
	// Span, if set, hears how long they took.
	Fail func()
	Span func(name string, start time.Time)
	// Watch, if set, returns a context that ends when a member of the
	// view falls silent, and its stop function. The pairs' exchanges run
	// under it, so that a dead partner ends them at once; the allgather
	// of the table has the control channel's own liveness, and ends with
	// a lost-peer abort that the other members recover from.
	Watch func(context.Context) (context.Context, func())
}

// Run measures v's links and returns what they give: the ring order
// with Order and minOrderedRing or more members, the cost model and the
// poll with Tune and 2 or more. Every member probes, the figures are
// allgathered on the control channel into one table, and every member
// derives the same order and model from it. The order changes who
// passes to whom on the data channel, never the ranks.
func Run(ctx context.Context, env Env, v *view.View) (view.Probed, error) {
	n := len(v.IDs)
	ordering := env.Order && n >= minOrderedRing
	tuning := env.Tune && n >= 2
	striping := env.Stripes > 1 && n >= 2
	if !ordering && !tuning && !striping {
		return view.Probed{}, nil
	}
	if env.Fail != nil {
		env.Fail()
	}
	start := time.Now()
	t, err := probeTable(ctx, env, v)
	if err != nil {
		return view.Probed{}, err
	}
	if env.Span != nil {
		env.Span("link probes", start)
	}
	var p view.Probed
	order, _ := v.Ordered()
	if striping {
		k, gain := 1, 0.0
		if t.striped {
			if gain = stripingGain(t, v, ordering, order); gain >= stripesGain {
				k, t = env.Stripes, t.withStripedSpeeds()
			}
		}
		p.Stripes = &k
		env.Log.Info().Int("stripes", k).Bool("probed_striped", t.striped).Float64("striped_gain", gain).
			Msg("data channel stripes from link probes")
	}
	if ordering {
		order, p.Order = chooseOrder(env.Log, v, t.speeds())
	}
	if tuning {
		hosts := v.Hosts()
		m := ring.FitCostModel(t.probes(hosts), order)
		p.Model = &m
		poll := time.Duration(0)
		if t.cpuShares(hosts)[v.Rank] >= 1 {
			poll = smallPoll
		}
		p.Poll = &poll
		chunk, shared := ring.DefaultChunkBytes, t.allShared()
		if shared {
			chunk = sharedMemoryChunk
		}
		p.Chunk, p.PollAll = &chunk, &shared
		p.Hierarchy, p.HierarchyAlways = ring.FitHierarchy(t.probes(hosts), t.hosts()), env.Always
		if h := p.Hierarchy; h != nil {
			env.Log.Info().Int("machines", len(h.Groups)).Int("per_machine", len(h.Groups[0])).
				Float64("local_mb_s", h.Local.Beta/1e6).Float64("cross_mb_s", h.Cross.Beta/1e6).Bool("always", env.Always).
				Int("from_bytes", hierarchyFrom(m, n, h)).Msg("hierarchical allreduce: the view spans machines")
		}
		env.Log.Info().Float64("alpha_us", m.Alpha*1e6).Float64("beta_mb_s", m.Beta/1e6).Float64("gamma_mb_s", m.Gamma/1e6).
			Float64("encode_mb_s", m.Encode/1e6).Float64("decode_mb_s", m.Decode/1e6).Int("small_bytes", m.Threshold(n)).
			Int64("poll_us", poll.Microseconds()).Bool("poll_all", shared).Int("chunk_bytes", chunk).Dur("took", time.Since(start)).Msg("cost model from link probes")
	}
	return p, nil
}

// stripingGain returns how many times faster t's striped speeds make
// the ring of a large allreduce than its single ones, each in the order
// it would run in: the order of its own speeds if ordering, else order.
func stripingGain(t table, v *view.View, ordering bool, order []int) float64 {
	const size = 64 << 20
	hosts := v.Hosts()
	timeOf := func(t table) float64 {
		o := order
		if ordering {
			o = ring.ChooseOrder(t.speeds())
		}
		return ring.FitCostModel(t.probes(hosts), o).Ring(t.n, size)
	}
	return timeOf(t) / timeOf(t.withStripedSpeeds())
}

// chooseOrder returns the ring order speed gives, and it again as
// changed if it differs from v's current one (else nil).
func chooseOrder(log zerolog.Logger, v *view.View, speed [][]int64) (order, changed []int) {
	n := len(v.IDs)
	// nil is rank order: a ring that was ordered goes back to it.
	if order = ring.ChooseOrder(speed); order == nil {
		order = ring.RankOrder(n)
	}
	if slices.Equal(order, v.RingOrder()) {
		log.Debug().Ints("order", order).Msg("ring order kept after link probes")
		return order, nil
	}
	log.Info().Ints("order", order).Float64("slowest_link_mb_s", slowestLink(speed, order)/1e6).
		Float64("address_order_slowest_mb_s", slowestLink(speed, ring.RankOrder(n))/1e6).
		Msg("ring ordered from link probes")
	return order, order
}

// table is every member's probe figures, a row per rank: its send
// speed to every rank (bytes per second), its latency to every rank
// (nanoseconds), its send speed over striped connections to every rank
// (0 unless striped), then its kernel rates (kernelRates, bytes per second),
// the cores it may use and the CPUs online on its host, both in
// thousandths (coresUsable, coresOnline), and a hash of its machine's
// boot id (machineID), and whether all its links go through shared
// memory (allShared); 0 where unknown.
type table struct {
	n    int
	rows []int64
	// striped says the links were probed over striped connections too
	// (Env.Stripes), the same on every member.
	striped bool
}

// linkBlocks is the blocks of n figures a row starts with: speeds,
// latencies and striped speeds.
const linkBlocks = 3

// Kernel rates at the end of a probe table's row.
const (
	rateReduce = iota // float32 sum
	rateEncode        // float32 to bf16
	rateDecode        // bf16 summed into float32
	kernelRates
	coresUsable = kernelRates     // after the rates: kernels.Device.Usable
	coresOnline = kernelRates + 1 // kernels.Device.Online
	machineID   = kernelRates + 2 // machineHash(kernels.Device.Boot)
	allShared   = kernelRates + 3 // 1 if every link of the rank goes through shared memory
	hostID      = kernelRates + 4 // machineHash of its boot id and network namespace (hostOf)
	rowTail     = kernelRates + 5
)

// machineHash is a boot id as a probe table's figure: FNV-1a, 0 for an
// unknown one.
func machineHash(boot string) int64 {
	if boot == "" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(boot))
	return int64(h.Sum64() | 1)
}

// sharedMemoryChunk is the ring's pipeline chunk when every link of the
// view goes through shared memory. Copies there take tens of
// microseconds a chunk, so smaller chunks overlap a step's copy, its
// reduction and the next step's send better: gyre bench allreduce -n 2
// gave 4.9 GB/s at 1 MiB with 256 KiB chunks against 3.1 GB/s with the
// default 1 MiB, and 3.4-4.0 GB/s at 16 MiB against 2.7. Over TCP the
// same change halved the busbw at 1 MiB, hence only here.
const sharedMemoryChunk = 256 << 10

// sharedLinks reports whether t reaches every other member of v through
// shared memory.
func sharedLinks(t transport.Transport, v *view.View) bool {
	sm, ok := t.(transport.SharedMemoryReporter)
	if !ok {
		return false
	}
	for r, id := range v.IDs {
		if r != v.Rank && !sm.SharedMemory(id) {
			return false
		}
	}
	return true
}

// hostOf is a worker's machine for the hierarchical allreduce: its
// kernel's boot id and its network namespace, so that the namespace
// hosts of one kernel, whose links are network links, count apart (as
// the shared-memory path counts them); override, if set, instead.
func hostOf(override, boot string) string {
	if override != "" {
		return override
	}
	ns, err := os.Readlink("/proc/self/ns/net")
	if err != nil || boot == "" {
		return "" // unknown: the ranks count as one machine each
	}
	return boot + " " + ns
}

// hosts returns each rank's hostID, a rank whose machine is unknown
// counting as a machine of its own.
func (t table) hosts() []int {
	out := make([]int, t.n)
	for r := range t.n {
		id := t.tail(r)[hostID]
		if id == 0 {
			id = -int64(r) - 1
		}
		out[r] = int(id)
	}
	return out
}

// hierarchyFrom returns the smallest power-of-two size from which the
// hierarchy's model beats the flat ring's, for the log; 0 if none up to
// 1 GiB.
func hierarchyFrom(flat ring.CostModel, n int, h *ring.Hierarchy) int {
	for s := 1 << 10; s <= 1<<30; s *= 2 {
		if h.AllReduce(s) < flat.Ring(n, s) {
			return s
		}
	}
	return 0
}

// allShared reports whether every member reaches every other through
// shared memory.
func (t table) allShared() bool {
	for r := range t.n {
		if t.tail(r)[allShared] != 1 {
			return false
		}
	}
	return true
}

// kernelStagger separates the kernel timings of ranks that share a host,
// so that each times them on a core of its own: the timings take a few
// milliseconds.
const kernelStagger = 20 * time.Millisecond

// newTable returns an empty table for n members.
func newTable(n int) table {
	return table{n: n, rows: make([]int64, n*(linkBlocks*n+rowTail))}
}

// row returns rank r's row.
func (t table) row(r int) []int64 {
	w := linkBlocks*t.n + rowTail
	return t.rows[r*w : (r+1)*w : (r+1)*w]
}

// tail returns what follows rank r's link figures: kernel rates and
// machine (rateReduce to hostID).
func (t table) tail(r int) []int64 { return t.row(r)[linkBlocks*t.n:] }

// speeds returns the speed table, [from][to].
func (t table) speeds() [][]int64 {
	out := make([][]int64, t.n)
	for r := range out {
		out[r] = t.row(r)[:t.n]
	}
	return out
}

// withStripedSpeeds returns a copy of t whose speeds are the striped ones.
func (t table) withStripedSpeeds() table {
	c := table{n: t.n, rows: slices.Clone(t.rows), striped: t.striped}
	for r := range c.n {
		row := c.row(r)
		copy(row[:c.n], row[2*c.n:3*c.n])
	}
	return c
}

// probes returns the table as ring.Probes, for members on hosts (a rank's
// host, in rank order). The bf16 rates were timed on a core of one's own
// (kernelStagger); in a collective, ranks that share a host share its
// CPUs, so the rates are scaled to each rank's share (cpuShares). The
// float32 reduction is left alone: at tens of GB/s it is cheap beside
// any link, while the bf16 kernels run at a few GB/s and decide whether
// compression pays.
func (t table) probes(hosts []string) ring.Probes {
	n := t.n
	p := ring.Probes{Speed: make([][]float64, n), Latency: make([][]float64, n),
		Reduce: make([]float64, n), Encode: make([]float64, n), Decode: make([]float64, n)}
	shares := t.cpuShares(hosts)
	for r := range n {
		row := t.row(r)
		p.Speed[r], p.Latency[r] = make([]float64, n), make([]float64, n)
		for j := range n {
			p.Speed[r][j] = float64(row[j])
			p.Latency[r][j] = float64(row[n+j]) / 1e9
		}
		rates := t.tail(r)
		p.Reduce[r] = float64(rates[rateReduce])
		p.Encode[r] = float64(rates[rateEncode]) * shares[r]
		p.Decode[r] = float64(rates[rateDecode]) * shares[r]
	}
	return p
}

// cpuShares returns each rank's share of a core (cpuShares), for members
// on hosts. Ranks that reported a boot id are grouped by it, so that
// network namespaces or containers on one machine count as the one
// machine they are; the others by their address's host.
func (t table) cpuShares(hosts []string) []float64 {
	usable, online := make([]int64, t.n), make([]int64, t.n)
	machines := slices.Clone(hosts)
	for r := range t.n {
		row := t.tail(r)
		usable[r], online[r] = row[coresUsable], row[coresOnline]
		if id := row[machineID]; id != 0 {
			machines[r] = fmt.Sprintf("boot %x", uint64(id))
		}
	}
	return cpuShares(machines, usable, online)
}

// probeTable measures this worker's links and kernels and allgathers
// every member's figures on the control channel.
func probeTable(ctx context.Context, env Env, v *view.View) (table, error) {
	n := len(v.IDs)
	t := newTable(n)
	own := t.row(v.Rank)
	tail := t.tail(v.Rank)
	d := kernels.Probe()
	tail[coresUsable], tail[coresOnline] = int64(d.Usable()*1000), int64(d.Online*1000)
	tail[machineID] = machineHash(cmp.Or(env.Machine, d.Boot))
	if sharedLinks(env.T, v) {
		tail[allShared] = 1
	}
	tail[hostID] = machineHash(hostOf(env.Machine, d.Boot))
	if err := gatherMachines(ctx, v, t); err != nil {
		return t, fmt.Errorf("gyre: gather the members' machines: %w", err)
	}
	t.striped = env.Stripes > 1 && t.stripingMayPay(v.Hosts())
	lctx, stop := ctx, func() {}
	if env.Watch != nil {
		lctx, stop = env.Watch(ctx)
	}
	err := probeLinks(lctx, env, v, probePlan(t.machines()), own[:n], own[n:2*n], own[2*n:3*n], t.striped)
	stop()
	if err != nil {
		return t, fmt.Errorf("gyre: link probes: %w", err)
	}
	hosts := v.Hosts()
	before := 0 // ranks of this host before this one
	for r := range v.Rank {
		if hosts[r] == hosts[v.Rank] {
			before++
		}
	}
	select {
	case <-time.After(time.Duration(before) * kernelStagger):
	case <-ctx.Done():
		return t, ctx.Err()
	}
	measureKernels(tail[:kernelRates])
	if err := ring.AllGather(ctx, v.Ctrl, t.rows); err != nil {
		return t, fmt.Errorf("gyre: gather the link probes: %w", err)
	}
	if e := env.Log.Debug(); e.Enabled() {
		rows := make([]string, n)
		for r := range n {
			rows[r] = fmt.Sprint(mbPerSec(t.row(r)[:n]), " lat_us ", usOf(t.row(r)[n:2*n]), " striped ", mbPerSec(t.row(r)[2*n:3*n]))
		}
		e.Strs("links", rows).Msg("link speeds (MB/s), latencies and striped speeds, a row per sender")
	}
	return t, nil
}

// gatherMachines allgathers what every member knows of its machine
// before any link is probed (t's tail columns from coresUsable on: its
// cores, its machine, whether its links are all shared memory), so that
// the pairs' probes can be scheduled and striped. The table's gather
// sends them again, with the rest.
func gatherMachines(ctx context.Context, v *view.View, t table) error {
	const first, cols = coresUsable, rowTail - coresUsable
	n := len(v.IDs)
	buf := make([]int64, n*cols)
	copy(buf[v.Rank*cols:], t.tail(v.Rank)[first:])
	if err := ring.AllGather(ctx, v.Ctrl, buf); err != nil {
		return err
	}
	for r := range n {
		copy(t.tail(r)[first:], buf[r*cols:(r+1)*cols])
	}
	return nil
}

// machines returns each rank's machine, machineHash of its boot id (0
// unknown).
func (t table) machines() []int64 {
	out := make([]int64, t.n)
	for r := range out {
		out[r] = t.tail(r)[machineID]
	}
	return out
}

// stripingMayPay reports whether striping a link over several
// connections might make it faster, and so whether the links are probed
// striped too: not if every link is shared memory, which is never
// striped, nor if a member has less than a core of its own (cpuShares).
// Striping buys a link more cores (each QUIC connection runs on its own
// goroutines); with none to spare it only adds packets' overhead. For
// the same reason as the poll's rule: 6 QUIC namespace hosts on 2 cores
// gained nothing from more connections.
func (t table) stripingMayPay(hosts []string) bool {
	if t.allShared() {
		return false
	}
	for _, s := range t.cpuShares(hosts) {
		if s < 1 {
			return false
		}
	}
	return true
}

// measureKernels times, on this core, the kernels the cost model needs
// over reduceProbeBytes of float32, into rates (bytes of float32 per
// second, 0 if a kernel failed): the best of a few runs each, as a run
// can only be slowed.
func measureKernels(rates []int64) {
	x, y := make([]float32, reduceProbeBytes/4), make([]float32, reduceProbeBytes/4)
	half := make([]uint16, len(x))
	runs := [kernelRates]func() error{
		rateReduce: func() error { return kernels.Reduce(kernels.OpSum, x, y) },
		rateEncode: func() error { return kernels.EncodeBF16(half, x) },
		rateDecode: func() error { return kernels.ReduceBF16(kernels.OpSum, x, half) },
	}
	for k, run := range runs {
		best := time.Duration(math.MaxInt64)
		for range 4 {
			start := time.Now()
			if err := run(); err != nil {
				best = 0
				break
			}
			best = min(best, time.Since(start))
		}
		if best > 0 {
			rates[k] = int64(float64(reduceProbeBytes) / max(best, time.Microsecond).Seconds())
		}
	}
}

// usOf converts nanoseconds to whole microseconds, for logs.
func usOf(ns []int64) []int64 {
	out := make([]int64, len(ns))
	for i, v := range ns {
		out[i] = v / 1e3
	}
	return out
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

// probeLinks measures this worker's send speed (bytes per second) and
// latency (nanoseconds) to every other member of v into speed and
// latency, by rank, pair by pair as plan orders them. A link whose probe
// failed is logged and taken at failedProbeSpeed, with its latency if
// the round trips were timed before the failure (else 0, unknown). It
// ends at once with ctx: the caller ends it when a member falls silent,
// and the view is lost then.
func probeLinks(ctx context.Context, env Env, v *view.View, plan probeSchedule, speed, latency, stripedSpeed []int64, striped bool) error {
	single := bulk{payload: 0, ack: probeAck, size: probeMessage}
	if env.Stripes > 1 {
		// The probe channel is striped (Stripes auto): the single
		// probe's messages stay below wire.StripeMin, on one connection.
		single.size = wire.StripeMin / 2
	}
	// The receive buffer holds a striped message even when this probe
	// sends none: a leftover of an earlier probe cut off may be one.
	buf, rbuf := make([]byte, stripedMessage), make([]byte, stripedMessage)
	for round, pairs := range plan.rounds {
		if peer := partnerIn(pairs, v.Rank); peer >= 0 {
			p := prober{t: env.T, peer: v.IDs[peer], buf: buf, rbuf: rbuf, single: single, striped: striped,
				hdr: wire.Header{Kind: wire.KindProbe, Epoch: v.Epoch, Seq: env.Seq, Step: uint32(round)}}
			rctx, cancel := context.WithTimeout(ctx, probeRoundTimeout)
			s, l, err := p.exchange(rctx, v.Rank < peer)
			cancel()
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			switch {
			case err != nil && s.single > 0:
				env.Log.Warn().Err(err).Int("peer_rank", peer).Str("peer", string(v.IDs[peer])).
					Msg("striped link probe failed; the link is taken as unstriped")
				s.striped = failedProbeSpeed
			case err != nil:
				env.Log.Warn().Err(err).Int("peer_rank", peer).Str("peer", string(v.IDs[peer])).
					Msg("link probe failed; the ring avoids the link")
				s = speeds{single: failedProbeSpeed, striped: failedProbeSpeed}
			}
			speed[peer], latency[peer], stripedSpeed[peer] = s.single, l.Nanoseconds(), s.striped
		}
		if plan.barriers {
			// A rank with no pair in this round, or done early, must not
			// start its next pair while a rank of its machine still
			// probes this one.
			if err := v.Ctrl.Barrier(ctx); err != nil {
				if ctx.Err() != nil {
					return context.Cause(ctx) // a member fell silent: the view is lost
				}
				return fmt.Errorf("gyre: end probe round %d: %w", round, err)
			}
		}
	}
	return nil
}

// probeSchedule is the order of a view's pair probes: rounds of pairs
// that run at once, and whether every member waits for the others at the
// end of each round.
type probeSchedule struct {
	rounds   [][][2]int
	barriers bool
}

// probePlan schedules the probes of members on machines (a hash per
// rank, 0 unknown: a machine of its own). Ranks of one machine share its
// cores and its network interface: two of its pairs probed at once would
// each measure their share of them, not the link (over QUIC, whose
// packets cost CPU, namespace hosts of one kernel measured the CPU a
// pair got). So no two pairs of a round touch one machine. The pairs are
// taken in the order of the round-robin tournament (probePartner) and
// each goes to the first round where its machines are free; with every
// rank on a machine of its own that is the tournament itself, which
// needs no barriers, as a rank is in one pair at a time by itself. With
// machines shared, rounds end at a barrier, as a rank idle in a round
// would otherwise start its next pair early. Every member derives the
// same schedule from the same table.
func probePlan(machines []int64) probeSchedule {
	n := len(machines)
	key := make([]int64, n)
	shared := false
	seen := map[int64]bool{}
	for r, m := range machines {
		key[r] = m
		if m == 0 {
			key[r] = -int64(r) - 1
		}
		shared = shared || seen[key[r]]
		seen[key[r]] = true
	}
	var plan probeSchedule
	if !shared {
		for k := range probeRounds(n) {
			var pairs [][2]int
			for r := range n {
				if p := probePartner(n, r, k); p > r {
					pairs = append(pairs, [2]int{r, p})
				}
			}
			plan.rounds = append(plan.rounds, pairs)
		}
		return plan
	}
	plan.barriers = true
	var busy []map[int64]bool // by round: the machines in use
	for k := range probeRounds(n) {
		for r := range n {
			p := probePartner(n, r, k)
			if p <= r {
				continue
			}
			i := 0
			for ; i < len(busy) && (busy[i][key[r]] || busy[i][key[p]]); i++ {
			}
			if i == len(busy) {
				busy = append(busy, map[int64]bool{})
				plan.rounds = append(plan.rounds, nil)
			}
			busy[i][key[r]], busy[i][key[p]] = true, true
			plan.rounds[i] = append(plan.rounds[i], [2]int{r, p})
		}
	}
	return plan
}

// partnerIn returns rank's partner among pairs, or -1.
func partnerIn(pairs [][2]int, rank int) int {
	for _, pr := range pairs {
		switch rank {
		case pr[0]:
			return pr[1]
		case pr[1]:
			return pr[0]
		}
	}
	return -1
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
	buf  []byte      // what this side sends
	rbuf []byte      // what it receives
	// single is the bulk probe's messages; striped adds a bulk probe in
	// messages large enough to be striped (stripedMessage) after it.
	single  bulk
	striped bool
}

// speeds are a link's speeds in bytes per second: over one connection,
// and over the striped ones (0 if not probed).
type speeds struct{ single, striped int64 }

// bulk is one bulk probe's messages: their flags, the flags of their
// acknowledgement, and their size. A message of at least wire.StripeMin
// goes over every stripe of the probe channel, a smaller one over the
// first only.
type bulk struct {
	payload, ack uint8
	size         int
}

var stripedBulk = bulk{payload: probeStriped, ack: probeStripedAck, size: stripedMessage}

// exchange times the latency, this side's pings first if first, then
// probes both directions at once, and returns this side's send speeds
// and its latency to the peer. The round trips come first because they
// leave the two sides in step, within a round trip of each other: a side
// that started the bulk probe while its peer was still busy elsewhere
// would count the wait as transfer time. On failure the latency is
// returned if it was timed, and so is the single speed if only the
// striped probe failed.
func (p prober) exchange(ctx context.Context, first bool) (s speeds, latency time.Duration, err error) {
	if first {
		if latency, err = p.ping(ctx); err == nil {
			err = p.pong(ctx)
		}
	} else if err = p.pong(ctx); err == nil {
		latency, err = p.ping(ctx)
	}
	if err != nil {
		return s, latency, err
	}
	if s.single, err = p.both(ctx, p.single); err != nil || !p.striped {
		return s, latency, err
	}
	if err = p.warm(ctx); err != nil {
		return s, latency, err
	}
	// Striping's gain is a few tens of percent, within one probe's noise
	// on a busy host (five jobs between the same two namespace hosts
	// measured 0.79x to 1.39x with one run of each): both kinds are
	// probed twice, alternately, and each keeps its faster run, as a
	// probe can only under-measure.
	for i := range 2 {
		var striped, single int64
		if striped, err = p.both(ctx, stripedBulk); err != nil {
			return s, latency, err
		}
		s.striped = max(s.striped, striped)
		if i == 1 {
			break
		}
		if single, err = p.both(ctx, p.single); err != nil {
			return s, latency, err
		}
		s.single = max(s.single, single)
	}
	return s, latency, nil
}

// warm sends one striped message while it awaits the peer's, untimed: it
// dials the stripes' connections where they are new. The message goes
// from a goroutine of its own, as the bulk probes' do: neither side's
// send may wait for the other to read, as a shared-memory ring of 64 KiB
// would.
func (p prober) warm(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sent := make(chan error, 1)
	go func() {
		h := p.hdr
		h.Flags = probeWarm
		if err := p.t.Send(ctx, p.peer, transport.ChanProbe, h, p.buf[:stripedMessage]); err != nil {
			sent <- fmt.Errorf("gyre: probe %s striped: %w", p.peer, err)
			return
		}
		sent <- nil
	}()
	err := p.await(ctx, probeWarm)
	if err != nil {
		cancel()
	}
	return errors.Join(err, <-sent)
}

// ping times pingCount round trips of an empty message and returns half
// the median.
func (p prober) ping(ctx context.Context) (time.Duration, error) {
	rtts := make([]time.Duration, pingCount)
	h := p.hdr
	h.Flags = probePing
	for i := range rtts {
		h.Chunk = uint32(i)
		start := time.Now()
		if err := p.t.Send(ctx, p.peer, transport.ChanProbe, h, nil); err != nil {
			return 0, fmt.Errorf("gyre: ping %s: %w", p.peer, err)
		}
		if err := p.await(ctx, probePong); err != nil {
			return 0, err
		}
		rtts[i] = time.Since(start)
	}
	slices.Sort(rtts)
	return max(rtts[len(rtts)/2]/2, time.Nanosecond), nil
}

// pong answers the peer's pingCount pings.
func (p prober) pong(ctx context.Context) error {
	h := p.hdr
	h.Flags = probePong
	for i := range pingCount {
		if err := p.await(ctx, probePing); err != nil {
			return err
		}
		h.Chunk = uint32(i)
		if err := p.t.Send(ctx, p.peer, transport.ChanProbe, h, nil); err != nil {
			return fmt.Errorf("gyre: answer the ping of %s: %w", p.peer, err)
		}
	}
	return nil
}

// both sends probeBytes to the peer in messages of b, while the peer
// sends as many back, as an allreduce's links carry data both ways at
// once, and returns this side's send speed: probeBytes over the time
// from the first send to the peer's acknowledgement. (One way at a time,
// loopback TCP measured twice the speed an allreduce gets from it.) The
// payloads go from a goroutine of their own while this one reads the
// peer's payloads and acknowledgement, the only reader of the probe
// channel. The channel is ordered, so a peer that finished its side
// first and went on to its next bulk probe is read in turn.
func (p prober) both(ctx context.Context, b bulk) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	count := probeBytes / b.size
	start := time.Now()
	sent := make(chan error, 1)
	go func() {
		for i := range count {
			h := p.hdr
			h.Chunk, h.Flags = uint32(i), b.payload
			if err := p.t.Send(ctx, p.peer, transport.ChanProbe, h, p.buf[:b.size]); err != nil {
				sent <- fmt.Errorf("gyre: probe %s: %w", p.peer, err)
				return
			}
		}
		sent <- nil
	}()
	got, elapsed, err := 0, time.Duration(0), error(nil)
	for err == nil && (got < count || elapsed == 0) {
		var h wire.Header
		if h, _, err = p.t.Recv(ctx, p.peer, transport.ChanProbe, p.rbuf); err != nil {
			err = fmt.Errorf("gyre: probe of %s: %w", p.peer, err)
			break
		}
		if !p.ours(h) {
			continue
		}
		switch {
		case h.Flags == b.payload && got < count:
			if got++; got == count {
				ack := p.hdr
				ack.Flags = b.ack
				if err = p.t.Send(ctx, p.peer, transport.ChanProbe, ack, nil); err != nil {
					err = fmt.Errorf("gyre: acknowledge the probe of %s: %w", p.peer, err)
				}
			}
		case h.Flags == b.ack && elapsed == 0:
			elapsed = max(time.Since(start), time.Microsecond)
		default:
			err = fmt.Errorf("gyre: probe of %s out of step: flags %d after %d payloads", p.peer, h.Flags, got)
		}
	}
	if err != nil {
		cancel()
	}
	if serr := <-sent; err == nil {
		err = serr
	}
	if err != nil {
		return 0, err
	}
	return int64(float64(probeBytes) / elapsed.Seconds()), nil
}

// ours reports whether h belongs to this exchange (as opposed to a
// leftover of an earlier probe).
func (p prober) ours(h wire.Header) bool {
	return h.Kind == wire.KindProbe && h.Epoch == p.hdr.Epoch && h.Seq == p.hdr.Seq && h.Step == p.hdr.Step
}

// await reads the next message of this exchange with the given flags,
// skipping those of other probes.
func (p prober) await(ctx context.Context, flags uint8) error {
	for {
		h, _, err := p.t.Recv(ctx, p.peer, transport.ChanProbe, p.rbuf)
		if err != nil {
			return fmt.Errorf("gyre: probe of %s: %w", p.peer, err)
		}
		if p.ours(h) {
			if h.Flags != flags {
				return fmt.Errorf("gyre: probe of %s out of step: flags %d, want %d", p.peer, h.Flags, flags)
			}
			return nil
		}
	}
}

// cpuShares returns each rank's share of a core: 1, or less where the
// rank may use less than a core (usable, its cgroup quota or affinity),
// or where more ranks share its host (hosts, by rank) than the host has
// CPUs online to give one each. usable and online are each rank's
// reports, in thousandths; 0 is unknown and limits nothing.
func cpuShares(hosts []string, usable, online []int64) []float64 {
	count := map[string]int{}
	for _, h := range hosts {
		count[h]++
	}
	shares := make([]float64, len(hosts))
	for r, h := range hosts {
		shares[r] = 1
		if u := float64(usable[r]) / 1000; u > 0 {
			shares[r] = min(shares[r], u)
		}
		if o := float64(online[r]) / 1000; o > 0 {
			shares[r] = min(shares[r], o/float64(count[h]))
		}
	}
	return shares
}
