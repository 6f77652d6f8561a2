package ring

import (
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
)

// TestOrderedAllReduce runs float32 allreduces around a shuffled ring order
// and checks what reordering promises: every rank holds the identical
// result, within 1e-6 relative of the rank-order result, and the
// rank-indexed collectives (allgather, broadcast) give exactly what they
// give in rank order.
func TestOrderedAllReduce(t *testing.T) {
	const n, length = 5, 10_007
	order := shuffledOrder(n)
	plain := newCluster(t, n, func(c *Config) { c.ChunkBytes = 4096; c.SmallBytes = -1 })
	ordered := newCluster(t, n, func(c *Config) { c.ChunkBytes = 4096; c.SmallBytes = -1; c.Order = order })
	if got := ordered.comms[2].Order(); !slices.Equal(got, order) {
		t.Fatalf("Order() = %v, want %v", got, order)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	inputs := randomInputs[float32](rng, n, length)
	want, got := clone(inputs), clone(inputs)
	mustAll(t, each(plain.comms, func(r int, c *Comm) error { return AllReduce(t.Context(), c, wire.OpSum, want[r]) }))
	mustAll(t, each(ordered.comms, func(r int, c *Comm) error { return AllReduce(t.Context(), c, wire.OpSum, got[r]) }))
	for r := 1; r < n; r++ {
		if !slices.Equal(got[r], got[0]) {
			t.Fatalf("rank %d's ordered result differs from rank 0's", r)
		}
	}
	if slices.Equal(got[0], want[0]) {
		t.Fatal("the ordered result equals rank order's bit for bit: was the order used?")
	}
	var diff, norm float64
	for i := range got[0] {
		d := float64(got[0][i]) - float64(want[0][i])
		diff += d * d
		norm += float64(want[0][i]) * float64(want[0][i])
	}
	if rel := math.Sqrt(diff / norm); rel > 1e-6 {
		t.Fatalf("ordered result is %.3g relative from rank order's", rel)
	}

	rows := make([][]int64, n)
	for r := range rows {
		rows[r] = make([]int64, n*3)
		for i := range 3 {
			rows[r][r*3+i] = int64(100*r + i)
		}
	}
	mustAll(t, each(ordered.comms, func(r int, c *Comm) error { return AllGather(t.Context(), c, rows[r]) }))
	for r := range rows {
		for q := range n {
			if rows[r][q*3] != int64(100*q) {
				t.Fatalf("rank %d holds %v, want rank %d's row at %d", r, rows[r], q, q*3)
			}
		}
	}
	bufs := randomInputs[float64](rng, n, 333)
	root := order[2]
	mustAll(t, each(ordered.comms, func(r int, c *Comm) error { return Broadcast(t.Context(), c, root, bufs[r]) }))
	for r := range bufs {
		if !slices.Equal(bufs[r], bufs[root]) {
			t.Fatalf("rank %d does not hold root %d's buffer", r, root)
		}
	}
}

// TestSetOrder changes a Comm's ring order between collectives and refuses
// orders that are not permutations of the ranks.
func TestSetOrder(t *testing.T) {
	const n = 4
	cl := newCluster(t, n, func(c *Config) { c.SmallBytes = -1 })
	for _, bad := range [][]int{{0, 1, 2}, {0, 1, 2, 2}, {0, 1, 2, 4}, {-1, 0, 1, 2}} {
		if err := cl.comms[0].SetOrder(bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetOrder(%v) = %v, want ErrInvalid", bad, err)
		}
	}
	if _, err := NewComm(cl.trs[0], Config{Members: cl.ids, Order: []int{3, 3, 1, 0}}); !errors.Is(err, ErrInvalid) {
		t.Errorf("NewComm with a bad order = %v, want ErrInvalid", err)
	}
	order := []int{0, 2, 1, 3}
	mustAll(t, each(cl.comms, func(r int, c *Comm) error { return c.SetOrder(order) }))
	bufs := make([][]int64, n)
	for r := range bufs {
		bufs[r] = []int64{int64(r + 1), 10, 100, 1000, 5}
	}
	mustAll(t, each(cl.comms, func(r int, c *Comm) error { return AllReduce(t.Context(), c, wire.OpSum, bufs[r]) }))
	for r := range bufs {
		if want := []int64{10, 40, 400, 4000, 20}; !slices.Equal(bufs[r], want) {
			t.Fatalf("rank %d: %v, want %v", r, bufs[r], want)
		}
	}
}
