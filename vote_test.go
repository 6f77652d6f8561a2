package gyre

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
		{"one late", []int64{statusTimeout, statusTimeout, statusTimeout}, []int64{10, 1600, 12}, []int{1}},
		{"late but within half", []int64{statusTimeout, statusTimeout}, []int64{10, 400}, nil},
		{"two late", []int64{statusTimeout, statusOK, statusTimeout, statusTimeout}, []int64{900, 5, 1200, 7}, []int{0, 2}},
		{"everyone late", []int64{statusTimeout, statusTimeout}, []int64{2000, 2000}, nil},
		{"a mismatch too", []int64{statusTimeout, statusMismatch}, []int64{10, 1600}, nil},
		{"no failure", []int64{statusOK, statusOK}, []int64{10, 1600}, nil},
	} {
		recs := make([]record, len(tc.status))
		for i := range recs {
			recs[i] = record{status: tc.status[i], compute: ms(tc.computeM[i])}
		}
		if got := lateRanks(recs, timeout); !slices.Equal(got, tc.want) {
			t.Errorf("%s: lateRanks = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRedoMismatch: a table of mismatches is redone once per iteration;
// the second at the same iteration, or any other failure, is not.
func TestRedoMismatch(t *testing.T) {
	w := &Worker{redoneMismatch: -1, iter: 7}
	mismatch := []record{{status: statusOK}, {status: statusMismatch}}
	if !w.redoMismatch(mismatch) {
		t.Fatal("first mismatch at iteration 7 not redone")
	}
	if w.redoMismatch(mismatch) {
		t.Fatal("second mismatch at iteration 7 redone")
	}
	w.iter = 8
	if w.redoMismatch([]record{{status: statusMismatch}, {status: statusTimeout}}) {
		t.Fatal("a mismatch with a timeout redone")
	}
	if !w.redoMismatch(mismatch) {
		t.Fatal("first mismatch at iteration 8 not redone")
	}
}
