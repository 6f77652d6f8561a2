package gyre

import "testing"

// TestCheckInterval: hashing is checked every boundary while it costs at
// most 1% of the iteration, and less often, in proportion, beyond.
func TestCheckInterval(t *testing.T) {
	for _, tc := range []struct {
		hash, wall []int64
		want       int64
	}{
		{[]int64{0, 0}, []int64{5e6, 6e6}, 1},
		{[]int64{10e3, 20e3}, []int64{5e6, 6e6}, 1},
		{[]int64{1e6, 2e6}, []int64{50e6, 100e6}, 2},
		{[]int64{1e6, 3e6}, []int64{50e6, 100e6}, 3},
		{[]int64{1e9, 1e9}, []int64{1e6, 1e6}, maxCheckInterval},
	} {
		recs := make([]record, len(tc.hash))
		for i := range recs {
			recs[i] = record{hashNs: tc.hash[i], wall: tc.wall[i]}
		}
		if got := checkInterval(recs); got != tc.want {
			t.Errorf("hash %v wall %v: interval %d, want %d", tc.hash, tc.wall, got, tc.want)
		}
	}
}
