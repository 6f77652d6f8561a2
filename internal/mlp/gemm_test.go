package mlp

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// TestGemmMatchesGonum checks the bounded product against gonum's own, bit
// for bit, for every transposition the model uses and shapes on both sides
// of gonum's parallel cut, with edges that are not whole blocks.
func TestGemmMatchesGonum(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	fill := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = r.NormFloat64()
		}
		return v
	}
	shapes := [][3]int{{1, 1, 1}, {5, 7, 3}, {64, 64, 64}, {65, 130, 200}, {128, 128, 1}, {300, 70, 129}, {200, 256, 64}}
	cases := [][2]blas.Transpose{{blas.NoTrans, blas.NoTrans}, {blas.Trans, blas.NoTrans}, {blas.NoTrans, blas.Trans}}
	for _, sh := range shapes {
		m, n, k := sh[0], sh[1], sh[2]
		for _, tr := range cases {
			a, b := general(m, k, fill(m*k)), general(k, n, fill(k*n))
			if tr[0] == blas.Trans {
				a = general(k, m, a.Data)
			}
			if tr[1] == blas.Trans {
				b = general(n, k, b.Data)
			}
			c0 := fill(m * n)
			for _, beta := range []float64{0, 1, 0.5} {
				want := slices.Clone(c0)
				if beta == 0 {
					want[0] = math.NaN() // beta 0 must overwrite, never scale
				}
				got := slices.Clone(want)
				blas64.Gemm(tr[0], tr[1], 1, a, b, beta, general(m, n, want))
				for _, procs := range []int{1, 2, 3, 0} {
					name := fmt.Sprintf("%dx%dx%d/%c%c/beta%g/procs%d", m, n, k, tr[0], tr[1], beta, procs)
					c := slices.Clone(got)
					gemm(procs, tr[0], tr[1], a, b, beta, general(m, n, c))
					for i := range c {
						if math.Float64bits(c[i]) != math.Float64bits(want[i]) {
							t.Fatalf("%s: c[%d] = %v, gonum gives %v", name, i, c[i], want[i])
						}
					}
				}
			}
		}
	}
}

// TestModelProcsSameResult trains the same steps with gonum's own split and
// with one and three goroutines: the losses and parameters are identical.
func TestModelProcsSameResult(t *testing.T) {
	ds := NewDataset(3)
	var final [][][]float64
	for _, procs := range []int{0, 1, 3} {
		m, err := New([]int{InputDim, 200, 130, NumClasses}, 5)
		if err != nil {
			t.Fatal(err)
		}
		m.SetProcs(procs)
		if m.Procs() != procs {
			t.Fatalf("Procs() = %d after SetProcs(%d)", m.Procs(), procs)
		}
		trainLocal(t, m, NewDefaultSGD(m), ds, 0, 3, 256, 0, nil)
		final = append(final, m.Params())
	}
	for i := 1; i < len(final); i++ {
		for l := range final[0] {
			if !slices.Equal(final[0][l], final[i][l]) {
				t.Fatalf("layer %d differs between gonum's split and a bounded one (run %d)", l, i)
			}
		}
	}
}

func TestComputeProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for procs, want := range map[int]int{1: 1, 2: 1, 3: 2, 8: 7} {
		runtime.GOMAXPROCS(procs)
		if got := ComputeProcs(); got != want {
			t.Errorf("GOMAXPROCS %d: ComputeProcs() = %d, want %d", procs, got, want)
		}
	}
}

// BenchmarkGemmProcs compares gonum's own split with bounded ones on a
// product the size of the overlap benchmark's layers.
func BenchmarkGemmProcs(b *testing.B) {
	const m, n, k = 3072, 256, 256
	a, w, c := general(m, k, make([]float64, m*k)), general(k, n, make([]float64, k*n)), general(m, n, make([]float64, m*n))
	for _, procs := range []int{0, 1, 2} {
		b.Run(fmt.Sprintf("procs%d", procs), func(b *testing.B) {
			b.SetBytes(8 * (m*k + k*n + m*n))
			for b.Loop() {
				gemm(procs, blas.NoTrans, blas.NoTrans, a, w, 1, c)
			}
		})
	}
}
