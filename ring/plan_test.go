package ring

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestSegments(t *testing.T) {
	tests := []struct {
		length, n int
		want      []Span
	}{
		{0, 1, []Span{{0, 0}}},
		{0, 3, []Span{{0, 0}, {0, 0}, {0, 0}}},
		{2, 3, []Span{{0, 1}, {1, 1}, {2, 0}}},
		{7, 3, []Span{{0, 3}, {3, 2}, {5, 2}}},
		{9, 3, []Span{{0, 3}, {3, 3}, {6, 3}}},
		{10, 4, []Span{{0, 3}, {3, 3}, {6, 2}, {8, 2}}},
		{5, 0, nil},
		{-1, 2, nil},
	}
	for _, tt := range tests {
		if got := Segments(tt.length, tt.n); !slices.Equal(got, tt.want) {
			t.Errorf("Segments(%d, %d) = %v, want %v", tt.length, tt.n, got, tt.want)
		}
	}
	for n := 1; n <= 70; n++ {
		for _, length := range []int{0, 1, n - 1, n, n + 1, 3*n + 2, 1000, 1_000_003} {
			s := Segments(length, n)
			q := length / n
			off := 0
			for i, sp := range s {
				want := q
				if i < length%n {
					want++
				}
				if sp.Off != off || sp.Len != want {
					t.Fatalf("Segments(%d, %d)[%d] = %+v, want {%d %d}", length, n, i, sp, off, want)
				}
				off = sp.End()
			}
			if off != length {
				t.Fatalf("Segments(%d, %d) covers %d", length, n, off)
			}
		}
	}
}

func TestAlgo(t *testing.T) {
	for a := AlgoNone; a <= algoEnd; a++ {
		if a.Valid() != (a != AlgoNone && a != algoEnd) {
			t.Errorf("%v.Valid() = %v", a, a.Valid())
		}
		if s := a.String(); s == "" || (a < algoEnd) == strings.HasPrefix(s, "algo(") {
			t.Errorf("Algo(%d).String() = %q", a, s)
		}
	}
}

// orderOverwritesScan is orderOverwrites as first written, a scan of the
// sends for every receive: the reference the sweep must match.
func orderOverwritesScan(p Plan) Plan {
	for j := range p.Recvs {
		r := &p.Recvs[j]
		if r.Reduce || r.After >= 0 || r.Len == 0 {
			continue
		}
		for i := len(p.Sends) - 1; i >= 0; i-- {
			s := &p.Sends[i]
			if s.Step < r.Step && s.Len > 0 && s.Off < r.End() && r.Off < s.End() {
				r.After = i
				break
			}
		}
	}
	return p
}

// TestOrderOverwritesMatchesScan checks orderOverwrites against the scan
// on every kind of plan at small sizes (with the overwrites' After reset:
// the constructors leave them -1), and on random plans whose steps, spans
// and preset Afters follow no order.
func TestOrderOverwritesMatchesScan(t *testing.T) {
	same := func(what string, p Plan) {
		t.Helper()
		want := orderOverwritesScan(clonePlan(p))
		got := orderOverwrites(clonePlan(p))
		for j := range want.Recvs {
			if got.Recvs[j] != want.Recvs[j] {
				t.Fatalf("%s: receive %d = %+v, the scan gives %+v", what, j, got.Recvs[j], want.Recvs[j])
			}
		}
	}
	for _, n := range []int{1, 2, 3, 4, 5, 8} {
		for _, k := range kinds(n) {
			for _, length := range []int{0, 1, n + 1, 3*n + 2, 61} {
				for _, chunk := range []int{1, 2, 5, 1 << 30} {
					for r, p := range plans(t, k, n, length, chunk) {
						for j := range p.Recvs {
							if !p.Recvs[j].Reduce {
								p.Recvs[j].After = -1
							}
						}
						same(fmt.Sprintf("%s n=%d length=%d chunk=%d rank %d", k.name, n, length, chunk, r), p)
					}
				}
			}
		}
	}
	rng := rand.New(rand.NewPCG(7, 7))
	xfers := func(count, length, afters int) []Xfer {
		xs := make([]Xfer, count)
		for i := range xs {
			off := rng.IntN(length + 1)
			xs[i] = Xfer{Span: Span{Off: off, Len: rng.IntN(length - off + 1)}, Step: rng.IntN(6),
				Reduce: rng.IntN(4) == 0, After: rng.IntN(afters+2) - 2}
		}
		return xs
	}
	for i := range 2000 {
		length := 1 + rng.IntN(40)
		p := Plan{Length: length}
		p.Sends = xfers(rng.IntN(12), length, 0)
		p.Recvs = xfers(rng.IntN(12), length, len(p.Sends))
		for j := range p.Recvs {
			p.Recvs[j].After = max(p.Recvs[j].After, -1)
		}
		same(fmt.Sprintf("random plan %d %+v", i, p), p)
	}
}

func clonePlan(p Plan) Plan {
	p.Sends, p.Recvs = slices.Clone(p.Sends), slices.Clone(p.Recvs)
	return p
}
