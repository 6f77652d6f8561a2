package mlp

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gyre-ml/gyre/datasets/mnist"
)

// fakeSet is n random images with random labels: the mapping does not
// care what the pixels are, and the tests need no files.
func fakeSet(n int, seed uint64) *mnist.Set {
	r := rand.New(rand.NewPCG(seed, 2))
	s := &mnist.Set{N: n, Images: make([]byte, n*mnist.Pixels), Labels: make([]byte, n)}
	for i := range s.Images {
		s.Images[i] = byte(r.IntN(256))
	}
	for i := range s.Labels {
		s.Labels[i] = byte(r.IntN(mnist.Classes))
	}
	return s
}

func newFakeMNIST(t *testing.T, n int, seed uint64) *MNIST {
	t.Helper()
	d, err := NewMNIST(fakeSet(n, 1), fakeSet(50, 2), seed)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestMNISTEpochIsAPermutation: the positions of each epoch visit every
// training example exactly once, and epochs come in different orders.
func TestMNISTEpochIsAPermutation(t *testing.T) {
	const n = 1000
	d := newFakeMNIST(t, n, 5)
	var orders [][]int
	for e := range int64(3) {
		order := make([]int, n)
		seen := make([]bool, n)
		for p := range int64(n) {
			ex := d.Example(e*n + p)
			if ex < 0 || ex >= n || seen[ex] {
				t.Fatalf("epoch %d position %d: example %d, out of range or seen before in the epoch", e, p, ex)
			}
			seen[ex], order[p] = true, ex
		}
		orders = append(orders, order)
	}
	if slices.Equal(orders[0], orders[1]) || slices.Equal(orders[1], orders[2]) {
		t.Error("two epochs visit the examples in the same order")
	}
	if slices.IsSorted(orders[0]) {
		t.Error("epoch 0 is not shuffled")
	}
}

// TestMNISTSameIndexSameExample: a position's sample depends only on the
// seed and the position, not on the instance, the order of the requests
// or how a batch is split between workers; another seed gives another
// order.
func TestMNISTSameIndexSameExample(t *testing.T) {
	const n = 1000
	a, b := newFakeMNIST(t, n, 5), newFakeMNIST(t, n, 5)
	// Positions in several epochs, b asked for them backwards, so its
	// cache of permutations holds other epochs at each request.
	positions := []int64{0, 1, n - 1, n, 2*n + 7, 5 * n, 3*n - 1, 17}
	for k := len(positions) - 1; k >= 0; k-- {
		if ea, eb := a.Example(positions[k]), b.Example(positions[k]); ea != eb {
			t.Errorf("position %d: example %d from one instance, %d from another", positions[k], ea, eb)
		}
	}
	// One worker's batch equals four workers' parts, in order.
	whole, wholeLabels := a.Batch(positions, nil, nil)
	var x []float64
	var labels []int
	for _, part := range [][]int64{positions[:3], positions[3:4], nil, positions[4:]} {
		px, pl := b.Batch(part, nil, nil)
		x, labels = append(x, px...), append(labels, pl...)
	}
	if !slices.Equal(whole, x) || !slices.Equal(wholeLabels, labels) {
		t.Error("a batch split four ways differs from the whole batch")
	}
	// What Batch writes is the example's image, standardised, and its label.
	for k, p := range positions {
		ex := a.Example(p)
		if labels[k] != int(a.train.Labels[ex]) {
			t.Errorf("position %d: label %d, example %d's is %d", p, labels[k], ex, a.train.Labels[ex])
		}
		for j, px := range a.train.Image(ex) {
			if want := (float64(px)/255 - MNISTMean) / MNISTStd; x[k*mnist.Pixels+j] != want {
				t.Fatalf("position %d pixel %d: %v, want %v", p, j, x[k*mnist.Pixels+j], want)
			}
		}
	}
	other := newFakeMNIST(t, n, 6)
	same := 0
	for p := range int64(n) {
		if a.Example(p) == other.Example(p) {
			same++
		}
	}
	if same > n/20 {
		t.Errorf("seeds 5 and 6 map %d of %d positions to the same example", same, n)
	}
}

// TestMNISTTestSet: the test split in file order, all of it for n <= 0 or
// too large, and the model's input width is the image's.
func TestMNISTTestSet(t *testing.T) {
	d := newFakeMNIST(t, 100, 1)
	if d.InputWidth() != 784 || d.TrainSize() != 100 {
		t.Fatalf("input width %d, training size %d", d.InputWidth(), d.TrainSize())
	}
	for _, tc := range []struct{ ask, want int }{{0, 50}, {10, 10}, {500, 50}} {
		x, labels := d.TestSet(tc.ask)
		if len(labels) != tc.want || len(x) != tc.want*mnist.Pixels {
			t.Fatalf("TestSet(%d): %d labels and %d inputs, want %d samples", tc.ask, len(labels), len(x), tc.want)
		}
		last := tc.want - 1
		if labels[last] != int(d.test.Labels[last]) || x[last*mnist.Pixels] != pixel[d.test.Image(last)[0]] {
			t.Errorf("TestSet(%d): sample %d is not test image %d", tc.ask, last, last)
		}
	}
	if _, err := NewMNIST(fakeSet(0, 1), fakeSet(5, 1), 1); err == nil {
		t.Error("NewMNIST took an empty training set")
	}
}
