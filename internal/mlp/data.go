package mlp

import (
	"math"
	"math/rand/v2"
)

const (
	// InputDim is the dimension of every input vector.
	InputDim = 32
	// NumClasses is the number of labels; labels are in [0, NumClasses).
	NumClasses = 10
	// TestStart is the first index of the test split. Indices below it are
	// the training split, indices from it upward the test split, so a
	// sampler that draws training indices from [0, TestStart) can never
	// hand out a test sample. 1<<40 is far more than any run draws.
	TestStart int64 = 1 << 40
)

// teacherConfig describes the labelling network and the sample margin.
type teacherConfig struct {
	sizes []int   // InputDim first, NumClasses last
	gain  float64 // weight std is gain/√fan_in
	// margin is the least gap between the teacher's top two logits that
	// a sample may have; Sample redraws x until it has that margin.
	margin float64
}

// defaultTeacher is the tuned task (measurements in doc.go). One tanh layer
// of 16 units with weights 3× the LeCun scale saturates often, so the
// labelling is far from linear: softmax regression stays near 67%. The
// margin removes the samples within 0.2 of a tie (about 15% of draws),
// which otherwise cap any student near 93% because the last percent sits
// on the boundaries; with it a 128-unit MLP passes 95% in under 1000
// iterations.
var defaultTeacher = teacherConfig{sizes: []int{InputDim, 16, NumClasses}, gain: 3, margin: 0.2}

const maxWidth = 64 // widest teacher layer allowed, for stack scratch

// Dataset is the synthetic classification task: inputs are standard
// Gaussian vectors of InputDim values, and the label of x is the argmax of a
// fixed random teacher network's output. Inputs whose top two teacher
// logits are closer than a margin are redrawn, so the inputs are Gaussian
// conditioned on that margin. Sample i is a pure function of
// (seed, i), so a worker generates exactly the samples a sampler assigns
// it, in any order, with nothing downloaded or shared.
//
// A Dataset is immutable after NewDataset and safe for concurrent use.
type Dataset struct {
	seed    uint64
	teacher []teacherLayer
	margin  float64
}

// teacherLayer holds W (in×out, row-major) and b.
type teacherLayer struct {
	in, out int
	w, b    []float64
}

// NewDataset returns the task for seed. Different seeds give different
// teachers and different inputs.
func NewDataset(seed uint64) *Dataset { return newDataset(seed, defaultTeacher) }

func newDataset(seed uint64, tc teacherConfig) *Dataset {
	d := &Dataset{seed: seed, teacher: make([]teacherLayer, len(tc.sizes)-1), margin: tc.margin}
	// The teacher's stream is separate from every sample's stream: samples
	// use (mix(seed), mix(index)), the teacher (mix(seed), a constant that
	// is not the mix of a small index).
	r := rand.New(rand.NewPCG(mix(seed), 0x7ea0c4e7_5eed_0001))
	for l := range d.teacher {
		in, out := tc.sizes[l], tc.sizes[l+1]
		std := tc.gain / math.Sqrt(float64(in))
		t := teacherLayer{in: in, out: out, w: make([]float64, in*out), b: make([]float64, out)}
		for i := range t.w {
			t.w[i] = std * r.NormFloat64()
		}
		for i := range t.b {
			t.b[i] = 0.5 * r.NormFloat64()
		}
		d.teacher[l] = t
	}
	d.balance()
	return d
}

// balance shifts the teacher's output biases until the classes are about
// equally frequent. A random teacher alone favours a few classes, and a
// task where one class dominates says little about accuracy. The shifts are
// fitted on a fixed calibration set drawn from its own stream, so they are
// part of the deterministic teacher.
func (d *Dataset) balance() {
	const (
		calib  = 4096
		rounds = 60
	)
	r := rand.New(rand.NewPCG(mix(d.seed), 0xba1a_0ce0_0000_0001))
	xs := make([]float64, calib*InputDim)
	for i := range xs {
		xs[i] = r.NormFloat64()
	}
	out := &d.teacher[len(d.teacher)-1]
	logits := make([]float64, calib*NumClasses)
	for i := 0; i < calib; i++ {
		d.logits(xs[i*InputDim:(i+1)*InputDim], logits[i*NumClasses:(i+1)*NumClasses])
	}
	// The biases are added to fixed pre-bias logits, so each round needs
	// only an argmax per sample. Each round moves every class's bias
	// against its excess frequency, with a step that shrinks over rounds.
	for i := 0; i < calib; i++ {
		for j := range NumClasses {
			logits[i*NumClasses+j] -= out.b[j]
		}
	}
	var counts [NumClasses]int
	var b [NumClasses]float64 // a local copy keeps the hot loop in registers and cache
	copy(b[:], out.b)
	for round := range rounds {
		counts = [NumClasses]int{}
		for i := 0; i < calib; i++ {
			row := logits[i*NumClasses : (i+1)*NumClasses]
			best := 0
			for j := 1; j < NumClasses; j++ {
				if row[j]+b[j] > row[best]+b[best] {
					best = j
				}
			}
			counts[best]++
		}
		step := 2.0 / float64(round+10)
		for j := range NumClasses {
			b[j] -= step * (float64(counts[j])/calib - 1.0/NumClasses) * NumClasses
		}
	}
	copy(out.b, b[:])
}

// Seed returns the seed the Dataset was made from.
func (d *Dataset) Seed() uint64 { return d.seed }

// Sample writes sample i's input into x, which must hold at least InputDim
// values, and returns its label. The result depends on nothing but the
// Dataset's seed and i.
func (d *Dataset) Sample(i int64, x []float64) (label int) {
	x = x[:InputDim]
	// PCG streams seeded with neighbouring values are visibly correlated,
	// so both seed words go through a mixer first.
	r := rand.New(rand.NewPCG(mix(d.seed), mix(uint64(i)^0x5bd1e995)))
	for {
		for j := range x {
			x[j] = r.NormFloat64()
		}
		var z [NumClasses]float64
		d.logits(x, z[:])
		if y, gap := top2(z[:]); gap >= d.margin {
			return y
		}
	}
}

// top2 returns the argmax of z (the lowest index on a tie) and the gap
// between the largest and the second largest value.
func top2(z []float64) (int, float64) {
	best := argmax(z)
	second := math.Inf(-1)
	for j, v := range z {
		if j != best {
			second = max(second, v)
		}
	}
	return best, z[best] - second
}

// label runs the teacher on x and returns the argmax (the lowest index on
// a tie).
// logits writes the teacher's output for x into z.
func (d *Dataset) logits(x, z []float64) {
	var bufA, bufB [maxWidth]float64
	cur, spare := bufA[:], bufB[:] // slices, so swapping them swaps no data
	in := x
	for l := range d.teacher {
		t := &d.teacher[l]
		out := cur[:t.out]
		copy(out, t.b)
		for i, xi := range in {
			row := t.w[i*t.out : (i+1)*t.out]
			for j, w := range row {
				out[j] += xi * w
			}
		}
		if l < len(d.teacher)-1 {
			for j := range out {
				out[j] = math.Tanh(out[j])
			}
		}
		in = out
		cur, spare = spare, cur
	}
	copy(z, in)
}

// Batch fills x (row-major, len(indices)×InputDim) and labels for the given
// sample indices, reusing the capacity of the slices passed in, and returns
// them. Row k is sample indices[k].
func (d *Dataset) Batch(indices []int64, x []float64, labels []int) ([]float64, []int) {
	n := len(indices)
	x = grow(x, n*InputDim)
	labels = growInts(labels, n)
	for k, i := range indices {
		labels[k] = d.Sample(i, x[k*InputDim:(k+1)*InputDim])
	}
	return x, labels
}

// TestIndices returns the first n indices of the test split.
func TestIndices(n int) []int64 {
	idx := make([]int64, n)
	for k := range idx {
		idx[k] = TestStart + int64(k)
	}
	return idx
}

// mix is SplitMix64's finaliser, a bijection that spreads neighbouring
// inputs over the whole 64-bit range.
func mix(z uint64) uint64 {
	z += 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func argmax(v []float64) int {
	best := 0
	for j := 1; j < len(v); j++ {
		if v[j] > v[best] {
			best = j
		}
	}
	return best
}

// grow returns s resized to n, reallocating with a quarter to spare when
// it is too small, so that a batch share creeping up by a few samples at
// a time (balancing) does not reallocate every iteration.
//
// A new buffer is faulted in here, one store per page in a plain loop.
// Otherwise its first writer faults the pages in: Dgemm's zeroing and
// the bias copy are runs of memclr and memmove, assembly that the Go
// scheduler cannot preempt, so for a 100 MB activation the process held
// its CPU for about 0.3 s (all goroutines stopped once a GC wanted the
// world), which a 15% CPU quota stretched past the peers' liveness
// timeout.
func grow(s []float64, n int) []float64 {
	if cap(s) >= n {
		return s[:n]
	}
	s = make([]float64, n, n+n/4)
	s = s[:cap(s)]
	for i := 0; i < len(s); i += pageFloats {
		s[i] = 0
	}
	return s[:n]
}

// pageFloats is the float64s in a 4 KiB page.
const pageFloats = 4096 / 8

func growInts(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, n)
	}
	return s[:n]
}
