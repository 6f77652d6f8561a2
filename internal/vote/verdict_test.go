package vote

import (
	"slices"
	"testing"
	"time"
)

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
		{[]int64{1e9, 1e9}, []int64{1e6, 1e6}, MaxCheckInterval},
	} {
		recs := make([]Record, len(tc.hash))
		for i := range recs {
			recs[i] = Record{HashNs: tc.hash[i], Wall: tc.wall[i]}
		}
		if got := CheckInterval(recs); got != tc.want {
			t.Errorf("hash %v wall %v: interval %d, want %d", tc.hash, tc.wall, got, tc.want)
		}
	}
}

// TestLateRanks: a table whose only failures are timeouts names the ranks
// whose compute time is at least half the timeout above the quickest's;
// any other failure, no timeout, or everyone late names nobody.
func TestLateRanks(t *testing.T) {
	const timeout = time.Second
	ms := func(v int64) int64 { return v * int64(time.Millisecond) }
	for _, tc := range []struct {
		name     string
		status   []int64
		computeM []int64
		want     []int
	}{
		{"one late", []int64{StatusTimeout, StatusTimeout, StatusTimeout}, []int64{10, 1600, 12}, []int{1}},
		{"late but within half", []int64{StatusTimeout, StatusTimeout}, []int64{10, 400}, nil},
		{"two late", []int64{StatusTimeout, StatusOK, StatusTimeout, StatusTimeout}, []int64{900, 5, 1200, 7}, []int{0, 2}},
		{"everyone late", []int64{StatusTimeout, StatusTimeout}, []int64{2000, 2000}, nil},
		{"a mismatch too", []int64{StatusTimeout, StatusMismatch}, []int64{10, 1600}, nil},
		{"no failure", []int64{StatusOK, StatusOK}, []int64{10, 1600}, nil},
	} {
		recs := make([]Record, len(tc.status))
		for i := range recs {
			recs[i] = Record{Status: tc.status[i], Compute: ms(tc.computeM[i])}
		}
		if got := LateRanks(recs, timeout); !slices.Equal(got, tc.want) {
			t.Errorf("%s: lateRanks = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRedoMismatch: a table of mismatches is redone once per iteration;
// the second at the same iteration, or any other failure, is not.
func TestRedoMismatch(t *testing.T) {
	mismatch := []Record{{Status: StatusOK}, {Status: StatusMismatch}}
	if !RedoMismatch(mismatch, 7, -1) {
		t.Fatal("first mismatch at iteration 7 not redone")
	}
	if RedoMismatch(mismatch, 7, 7) {
		t.Fatal("second mismatch at iteration 7 redone")
	}
	if RedoMismatch([]Record{{Status: StatusMismatch}, {Status: StatusTimeout}}, 8, 7) {
		t.Fatal("a mismatch with a timeout redone")
	}
	if !RedoMismatch(mismatch, 8, 7) {
		t.Fatal("first mismatch at iteration 8 not redone")
	}
}

func TestNewestCheckpoint(t *testing.T) {
	none := Record{Iter: -1}
	at := func(epoch uint64, iter int64) Record { return Record{Epoch: epoch, Iter: iter} }
	for _, tc := range []struct {
		name string
		recs []Record
		want int
	}{
		{"nobody holds one", []Record{none, none}, -1},
		{"one holder", []Record{none, at(1, 10)}, 1},
		{"the higher epoch wins over a later iteration", []Record{at(1, 90), at(2, 40), at(1, 80)}, 1},
		{"the later iteration in one epoch", []Record{at(3, 20), at(3, 30), none}, 1},
		{"a tie goes to the lowest rank", []Record{none, at(2, 30), at(2, 30)}, 1},
		{"iteration 0 counts", []Record{none, at(1, 0)}, 1},
	} {
		if got := NewestCheckpoint(tc.recs); got != tc.want {
			t.Errorf("%s: newestCheckpoint = %d, want %d", tc.name, got, tc.want)
		}
	}
}
