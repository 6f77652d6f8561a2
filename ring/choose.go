package ring

import (
	"math"
	"math/bits"
	"slices"

	"github.com/gyre-ml/gyre/internal/wire"
)

// Choose returns the allreduce algorithm for a buffer of lengthBytes bytes
// over n ranks: AlgoRecursiveDoubling below threshold bytes, AlgoRing at or
// above it. Every rank must pass the same threshold, or ranks run different
// algorithms (which the executor reports as a mismatch from the first
// frame's Algo). DefaultCostModel.Threshold(n) is the default.
func Choose(n, lengthBytes, threshold int) Algo {
	if lengthBytes < threshold {
		return AlgoRecursiveDoubling
	}
	return AlgoRing
}

// CostModel is the α/β performance model (docs/architecture.md,
// "Collectives"), plus the speed of the reduction itself. It predicts
// allreduce times and so the size at which the ring overtakes recursive
// doubling.
//
// The ring costs 2(n-1)·α + (n-1)/n·S·(max(1/β, 1/γ) + 1/β): 2(n-1) hops, and
// every rank sends 2(n-1)/n·S bytes, half of them during the reduce-scatter,
// whose reductions are pipelined with the transfers, so only the slower of
// the two counts. Recursive doubling costs h·α + h·S/β + hr·S/γ, with h =
// ⌊log2 n⌋ exchanges of the whole buffer (plus the fold and unfold steps when
// n is not a power of two) and hr of those reduced after arrival, not
// overlapped. Recursive doubling wins on latency (h < 2(n-1)) and loses on
// bandwidth (h ≥ 2(n-1)/n), so the two lines cross at one size per n.
//
// The model ignores the ring's pipeline fill (a chunk per hop) and the
// per-message overheads of small chunks. Both favour recursive doubling a
// little at small sizes, so the default threshold errs towards the ring only
// where the ring is predicted to win.
type CostModel struct {
	// Alpha is the one-hop message latency in seconds.
	Alpha float64
	// Beta is the link bandwidth in bytes per second.
	Beta float64
	// Gamma is the reduction rate in bytes per second.
	Gamma float64
	// Encode is the rate at which float32 data is rounded to bf16 for
	// the wire, and Decode the rate at which bf16 from the wire is reduced
	// into float32, both in float32 bytes per second (see Compression).
	Encode, Decode float64
}

// DefaultCostModel holds figures a prototype measured on the project's
// 2-core machine for TLS-less TCP on loopback: about 20 µs per hop (half
// the 20–45 µs measured for a 4 KiB message with the small-message path),
// 2 GB/s per link, and 4 GB/s for a plain Go float32 sum. With them the
// crossover is 80 kB at n = 2, 15 kB at n = 3, 107 kB at n = 4, 160 kB at
// n = 8 and 683 kB at n = 64: recursive doubling takes the 4 KiB and
// 64 KiB benchmark sizes (except 64 KiB at n = 3 and 5, where the ring's
// 2(n-1) hops are few), the ring everything from 1 MiB. QUIC's α and β are
// both about 4 to 10 times worse, so its αβ product and crossovers are
// similar. A worker replaces them with the figures its view measures
// (FitCostModel); the defaults stand for views that measured nothing.
//
// Encode and Decode are the bf16 kernels' rates on one core of the same
// machine (kernels' BenchmarkHalf1MiB, in float32 bytes).
var DefaultCostModel = CostModel{Alpha: 20e-6, Beta: 2e9, Gamma: 4e9, Encode: 4e9, Decode: 8e9}

// Ring returns the predicted time in seconds of a ring allreduce of bytes
// bytes over n ranks.
func (m CostModel) Ring(n, bytes int) float64 {
	a, b := m.ringLine(n)
	return a + b*float64(bytes)
}

// RecursiveDoubling returns the predicted time in seconds of a
// recursive-doubling allreduce of bytes bytes over n ranks.
func (m CostModel) RecursiveDoubling(n, bytes int) float64 {
	a, b := m.doublingLine(n)
	return a + b*float64(bytes)
}

// Threshold returns the buffer size in bytes from which the ring is
// predicted to be at least as fast as recursive doubling over n ranks: the
// threshold argument of Choose. It is 0 for n <= 1, where neither sends
// anything, and math.MaxInt if the ring never wins.
func (m CostModel) Threshold(n int) int {
	if n <= 1 {
		return 0
	}
	ar, br := m.ringLine(n)
	ad, bd := m.doublingLine(n)
	switch {
	case ad >= ar:
		return 0
	case bd <= br:
		return math.MaxInt
	}
	s := math.Ceil((ar - ad) / (bd - br))
	if s >= math.MaxInt {
		return math.MaxInt
	}
	return int(s)
}

// ringLine returns the ring's fixed cost in seconds and its cost per byte.
func (m CostModel) ringLine(n int) (fixed, perByte float64) {
	if n <= 1 {
		return 0, 0
	}
	f := float64(n-1) / float64(n)
	return 2 * float64(n-1) * m.Alpha, f * (max(1/m.Beta, 1/m.Gamma) + 1/m.Beta)
}

// doublingLine returns recursive doubling's fixed cost in seconds and its
// cost per byte.
func (m CostModel) doublingLine(n int) (fixed, perByte float64) {
	if n <= 1 {
		return 0, 0
	}
	hops, reduces := doublingSteps(n)
	return float64(hops) * m.Alpha, float64(hops)/m.Beta + float64(reduces)/m.Gamma
}

// doublingSteps returns how many whole-buffer exchanges recursive
// doubling makes over n ranks, and how many of them it reduces.
func doublingSteps(n int) (hops, reduces int) {
	logp := bits.Len(uint(n)) - 1
	if n != 1<<logp {
		return logp + 2, logp + 1
	}
	return logp, logp
}

// Validate reports a model whose figures are not all positive and
// finite, as ErrInvalid.
func (m CostModel) Validate() error {
	for _, f := range []float64{m.Alpha, m.Beta, m.Gamma, m.Encode, m.Decode} {
		if !(f > 0) || math.IsInf(f, 0) {
			return invalid("cost model %+v: every figure must be positive and finite", m)
		}
	}
	return nil
}

// AllReduce returns the predicted time in seconds of an allreduce of
// bytes bytes over n ranks by the algorithm Choose picks at threshold.
func (m CostModel) AllReduce(n, bytes, threshold int) float64 {
	if Choose(n, bytes, threshold) == AlgoRecursiveDoubling {
		return m.RecursiveDoubling(n, bytes)
	}
	return m.Ring(n, bytes)
}

// compressGain is how much faster than the uncompressed allreduce the
// model must predict the bf16 one to be for Compression to choose it.
// The margin is for the probes' noise: on loopback, with the rates the
// probes measured there, the model puts bf16 at 0.42 to 1.04 of the
// uncompressed speed as the measured link speed runs from 2.5 down to
// 1.1 GB/s, where bf16 ran at 0.55 to 0.67. At 0.75, large buffers are
// compressed on links slower than about a quarter of the encode rate
// (0.5 to 0.6 GB/s with those rates), such as a 1 Gbit/s link, where
// bf16 measured 1.8 to 1.9 times as fast.
const compressGain = 0.75

// AllReduceBF16 returns the predicted time in seconds of an allreduce of
// bytes float32 bytes over n ranks, by the algorithm Choose picks at
// threshold, with the data on the wire as bf16: half the bytes, and a
// bf16 reduction or decode after every receive, pipelined with the
// transfers as the float32 reduction is. Encoding is not overlapped with
// sending, as the send walker does one, then the other. Recursive
// doubling encodes before every send. The ring encodes the buffer once
// (its allgather forwards the wire image, compress.go), but the model
// charges 2(n−1)/n encodes, as many as it sends: for n > 2 the surplus
// stands for the CPU encoding takes from the transport, which the model
// does not otherwise count. (Ranks that share a host's cores also have
// their rates scaled down before the fit, by the runtime's probes.)
func (m CostModel) AllReduceBF16(n, bytes, threshold int) float64 {
	if n <= 1 {
		return 0
	}
	s := float64(bytes)
	wire := 1 / (2 * m.Beta)
	if Choose(n, bytes, threshold) == AlgoRecursiveDoubling {
		fixed, _ := m.doublingLine(n)
		hops, reduces := doublingSteps(n)
		return fixed + s*(float64(hops)*(wire+1/m.Encode)+float64(reduces)/m.Decode)
	}
	fixed, _ := m.ringLine(n)
	f := float64(n-1) / float64(n)
	return fixed + f*s*(2/m.Encode+2*max(wire, 1/m.Decode))
}

// Compression returns the wire type Comm.AutoCompression gives an
// allreduce of bytes float32 bytes over n ranks at threshold:
// wire.DTypeBF16 where the model predicts it at most compressGain of the
// uncompressed time, else wire.DTypeBytes (none). It depends on the model
// and its arguments alone, so every rank with the same model chooses
// alike.
func (m CostModel) Compression(n, bytes, threshold int) wire.DType {
	if n > 1 && m.AllReduceBF16(n, bytes, threshold) <= compressGain*m.AllReduce(n, bytes, threshold) {
		return wire.DTypeBF16
	}
	return wire.DTypeBytes
}

// Probes are a view's measurements, indexed by rank, with 0 wherever a
// figure is unknown (a failed probe, a rank's own link).
type Probes struct {
	// Speed[a][b] is the rate at which rank a sent to rank b, in bytes
	// per second.
	Speed [][]float64
	// Latency[a][b] is the one-way latency from a to b in seconds: half
	// the round trip of a small message.
	Latency [][]float64
	// Reduce[r] is rank r's reduction rate in bytes per second.
	Reduce []float64
	// Encode[r] and Decode[r] are rank r's bf16 rates (CostModel).
	Encode, Decode []float64
}

// FitCostModel returns the cost model of a ring through order (nil for
// rank order) from p. The ring runs at the pace of its slowest link, so
// Beta is the slowest of the ring's links and Alpha the longest of their
// latencies; Gamma is the slowest rank's. Each link is taken at its better
// direction, as ChooseOrder takes it: a probe is slowed by what else the
// machine did, never sped up. Recursive doubling's pairs that the ring
// does not join are assumed like the ring's links. A figure nothing
// measured is DefaultCostModel's. The result depends on p and order
// alone, so every rank that holds the same table fits the same model.
func FitCostModel(p Probes, order []int) CostModel {
	n := len(p.Speed)
	if order == nil {
		order = RankOrder(n)
	}
	return fitRings(p, [][]int{order})
}

// fitRings is FitCostModel for the links of several rings: the slowest
// of all their links, the longest latency.
func fitRings(p Probes, rings [][]int) CostModel {
	m := DefaultCostModel
	beta, alpha := math.Inf(1), 0.0
	for _, order := range rings {
		for i, a := range order {
			b := order[(i+1)%len(order)]
			if a == b {
				continue
			}
			if s := max(at(p.Speed, a, b), at(p.Speed, b, a)); s > 0 {
				beta = min(beta, s)
			}
			if l := quicker(at(p.Latency, a, b), at(p.Latency, b, a)); l > 0 {
				alpha = max(alpha, l)
			}
		}
	}
	if !math.IsInf(beta, 1) {
		m.Beta = beta
	}
	if alpha > 0 {
		m.Alpha = alpha
	}
	slowest(&m.Gamma, p.Reduce)
	slowest(&m.Encode, p.Encode)
	slowest(&m.Decode, p.Decode)
	return m
}

// slowest sets *rate to the smallest known (positive, finite) rate of
// rates, if there is one.
func slowest(rate *float64, rates []float64) {
	known := slices.DeleteFunc(slices.Clone(rates), func(g float64) bool { return !(g > 0) || math.IsInf(g, 0) })
	if len(known) > 0 {
		*rate = slices.Min(known)
	}
}

// at returns t[a][b], 0 if t has no such entry.
func at(t [][]float64, a, b int) float64 {
	if a < len(t) && b < len(t[a]) && t[a][b] > 0 && !math.IsInf(t[a][b], 0) {
		return t[a][b]
	}
	return 0
}

// quicker returns the smaller of two latencies, ignoring an unknown (0)
// one.
func quicker(x, y float64) float64 {
	switch {
	case x == 0:
		return y
	case y == 0:
		return x
	}
	return min(x, y)
}
