package ring

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
)

func TestGroups(t *testing.T) {
	for _, tc := range []struct {
		machine []int
		want    [][]int
	}{
		{[]int{7, 7, 9, 9}, [][]int{{0, 1}, {2, 3}}},
		{[]int{5, 3, 5, 3, 5, 3}, [][]int{{0, 2, 4}, {1, 3, 5}}}, // interleaved, in order of lowest rank
		{[]int{1, 1, 1, 1}, nil},                                 // one machine: the flat ring
		{[]int{1, 2, 3, 4}, nil},                                 // one rank each: the flat ring
		{[]int{1, 1, 2, 2, 2}, nil},                              // unequal machines
		{nil, nil},
	} {
		if got := Groups(tc.machine); !slices.EqualFunc(got, tc.want, slices.Equal) {
			t.Errorf("Groups(%v) = %v, want %v", tc.machine, got, tc.want)
		}
	}
}

func TestHierarchicalInvalid(t *testing.T) {
	for _, groups := range [][][]int{
		nil,
		{{0, 1}, {2}},     // unequal
		{{0, 1}, {1, 2}},  // rank 1 twice
		{{0, 1}, {2, 4}},  // rank 4 of 4
		{{0, -1}, {2, 3}}, // negative
	} {
		if _, err := Hierarchical(groups, 0, 100, 10); !errors.Is(err, ErrInvalid) {
			t.Errorf("Hierarchical(%v) = %v, want ErrInvalid", groups, err)
		}
	}
}

// hierarchicalKinds returns the hierarchical allreduce on m machines of l
// ranks, with machines of contiguous ranks and of interleaved ones.
func hierarchicalKinds(m, l int) []kind {
	n := m * l
	var ks []kind
	for _, layout := range []string{"contiguous", "interleaved"} {
		machine := make([]int, n)
		for r := range n {
			machine[r] = r / l
			if layout == "interleaved" {
				machine[r] = r % m
			}
		}
		groups := groupsOf(machine)
		ks = append(ks, kind{name: fmt.Sprintf("hierarchical-%dx%d-%s", m, l, layout), chunked: true, barrier: true,
			build: func(n, rank, length, chunk int) (Plan, error) { return Hierarchical(groups, rank, length, chunk) },
			want: func(w *world, r int) (int, int, []cell) {
				return 0, w.length, w.reduced()
			}})
	}
	return ks
}

// TestHierarchicalCollectives simulates the hierarchical allreduce for
// machine counts and sizes, contiguous and interleaved, at every length
// and chunk size of TestCollectives, with buffered and unbuffered sends:
// every element gets each rank's contribution once and is finished once,
// after the last, with no race between a send and a receive of the same
// elements; and the plans keep the per-peer order and the inline rule.
func TestHierarchicalCollectives(t *testing.T) {
	for _, ml := range [][2]int{{2, 2}, {2, 3}, {3, 2}, {4, 2}, {2, 4}, {3, 3}, {1, 3}, {3, 1}} {
		m, l := ml[0], ml[1]
		n := m * l
		for _, k := range hierarchicalKinds(m, l) {
			t.Run(k.name, func(t *testing.T) {
				t.Parallel()
				for _, length := range lengths(n) {
					for _, chunk := range chunkSizes {
						ps := plans(t, k, n, length, chunk)
						runPlans(t, k, ps, length, chunk, simConfig{hb: true})
						checkStructure(t, k, ps)
						if chunk >= 5 {
							runPlans(t, k, ps, length, chunk, simConfig{rendezvous: true})
						}
					}
				}
			})
		}
	}
}

// TestHierarchicalTraffic: across machines each rank sends 2(M-1)/M of
// its shard, an L-th of the buffer, and inside its machine 2(L-1)/L of
// the buffer: the flat ring would send 2(N-1)/N of it, all across
// machines when they alternate around the ring.
func TestHierarchicalTraffic(t *testing.T) {
	const m, l, length = 2, 4, 8000
	machine := make([]int, m*l)
	for r := range machine {
		machine[r] = r / l
	}
	groups := Groups(machine)
	for r := range m * l {
		p, err := Hierarchical(groups, r, length, 64)
		if err != nil {
			t.Fatal(err)
		}
		local, remote := 0, 0
		for _, x := range p.Sends {
			if machine[x.Peer] == machine[r] {
				local += x.Len
			} else {
				remote += x.Len
			}
		}
		if want := 2 * (l - 1) * length / l; local != want {
			t.Errorf("rank %d sends %d elements inside its machine, want %d", r, local, want)
		}
		if want := 2 * (m - 1) * (length / l) / m; remote != want {
			t.Errorf("rank %d sends %d elements across machines, want %d", r, remote, want)
		}
	}
}

// TestHierarchicalComm runs the hierarchical allreduce through Comms,
// over the in-memory transport and over QUIC with shared memory, for
// every dtype and op: each rank ends with the same reference result.
func TestHierarchicalComm(t *testing.T) {
	for _, tc := range []struct {
		name   string
		comms  func(t *testing.T) []*Comm
		groups [][]int
	}{
		{"mem/2x2", func(t *testing.T) []*Comm { return newCluster(t, 4, func(c *Config) { c.ChunkBytes = 64 }).comms }, [][]int{{0, 1}, {2, 3}}},
		{"mem/2x3-interleaved", func(t *testing.T) []*Comm { return newCluster(t, 6, func(c *Config) { c.ChunkBytes = 256 }).comms }, [][]int{{0, 2, 4}, {1, 3, 5}}},
		{"shm/2x2", func(t *testing.T) []*Comm { return realComms(t, "shm", 4, nil) }, [][]int{{0, 2}, {1, 3}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			comms := tc.comms(t)
			h := &Hierarchy{Groups: tc.groups, Local: DefaultCostModel, Cross: DefaultCostModel}
			mustAll(t, each(comms, func(_ int, c *Comm) error { return c.SetHierarchy(h, true) }))
			if got := comms[0].AllReduceAlgo(1 << 20); got != AlgoHierarchical {
				t.Fatalf("AllReduceAlgo(1 MiB) = %v with the hierarchy always on", got)
			}
			rng := rand.New(rand.NewPCG(uint64(len(comms)), 38))
			for _, length := range []int{0, 1, 7, 1009, 100_003} {
				for _, op := range []wire.Op{wire.OpSum, wire.OpMin, wire.OpMax, wire.OpAvg} {
					testAllReduce[float32](t, comms, rng, op, length)
					testAllReduce[float64](t, comms, rng, op, length)
					if op != wire.OpAvg {
						testAllReduce[int64](t, comms, rng, op, length)
						testAllReduce[int32](t, comms, rng, op, length)
					}
				}
			}
		})
	}
}

// TestSetHierarchy: the models decide where the hierarchy runs, the same
// on every rank; ranks that disagree fail with ErrMismatch; a hierarchy
// that does not fit the Comm is refused; nil turns it off.
func TestSetHierarchy(t *testing.T) {
	cl := newCluster(t, 4, nil)
	c := cl.comms[0]
	if err := c.SetHierarchy(&Hierarchy{Groups: [][]int{{0, 1}, {2}}, Local: DefaultCostModel, Cross: DefaultCostModel}, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetHierarchy of unequal machines = %v, want ErrInvalid", err)
	}
	if err := c.SetHierarchy(&Hierarchy{Groups: [][]int{{}, {0, 1, 2, 3}}, Local: DefaultCostModel, Cross: DefaultCostModel}, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetHierarchy with an empty machine = %v, want ErrInvalid", err)
	}
	if err := c.SetHierarchy(&Hierarchy{Groups: [][]int{{0, 1}, {2, 3}}}, false); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetHierarchy without models = %v, want ErrInvalid", err)
	}
	// Fast links inside the machines, slow between them: the flat ring
	// crosses the slow link at every step; the hierarchy carries a
	// quarter of the bytes across, from sizes where the hops do not count.
	fast := CostModel{Alpha: 5e-6, Beta: 5e9, Gamma: 10e9, Encode: 4e9, Decode: 8e9}
	slow := CostModel{Alpha: 50e-6, Beta: 0.1e9, Gamma: 10e9, Encode: 4e9, Decode: 8e9}
	h := &Hierarchy{Groups: [][]int{{0, 1}, {2, 3}}, Local: fast, Cross: slow}
	mustAll(t, each(cl.comms, func(_ int, c *Comm) error {
		return errors.Join(c.SetCostModel(slow), c.SetHierarchy(h, false))
	}))
	small, large := c.SmallBytes(), 16<<20
	if got := c.AllReduceAlgo(large); got != AlgoHierarchical {
		t.Errorf("16 MiB over a slow link between machines runs %v, want the hierarchy", got)
	}
	if got := c.AllReduceAlgo(small - 1); got != AlgoRecursiveDoubling {
		t.Errorf("below the ring's threshold: %v, want recursive doubling", got)
	}
	if p, want := c.PredictAllReduce(large), h.AllReduce(large); p != want {
		t.Errorf("PredictAllReduce(16 MiB) = %v, want the hierarchy's %v", p, want)
	}
	// Rank 3 turns it off alone: the next allreduce fails everywhere.
	if err := cl.comms[3].SetHierarchy(nil, false); err != nil {
		t.Fatal(err)
	}
	errs := each(cl.comms, func(r int, c *Comm) error {
		return AllReduce(t.Context(), c, wire.OpSum, make([]float32, large/4))
	})
	for r, err := range errs {
		if !errors.Is(err, ErrMismatch) {
			t.Errorf("rank %d, hierarchies that differ: %v, want ErrMismatch", r, err)
		}
	}
}
