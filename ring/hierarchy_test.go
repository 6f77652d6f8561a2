package ring

import (
	"errors"
	"fmt"
	"slices"
	"testing"
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
