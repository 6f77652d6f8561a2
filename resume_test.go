package gyre

import "testing"

func TestNewestCheckpoint(t *testing.T) {
	none := record{iter: -1}
	at := func(epoch uint64, iter int64) record { return record{epoch: epoch, iter: iter} }
	for _, tc := range []struct {
		name string
		recs []record
		want int
	}{
		{"nobody holds one", []record{none, none}, -1},
		{"one holder", []record{none, at(1, 10)}, 1},
		{"the higher epoch wins over a later iteration", []record{at(1, 90), at(2, 40), at(1, 80)}, 1},
		{"the later iteration in one epoch", []record{at(3, 20), at(3, 30), none}, 1},
		{"a tie goes to the lowest rank", []record{none, at(2, 30), at(2, 30)}, 1},
		{"iteration 0 counts", []record{none, at(1, 0)}, 1},
	} {
		if got := newestCheckpoint(tc.recs); got != tc.want {
			t.Errorf("%s: newestCheckpoint = %d, want %d", tc.name, got, tc.want)
		}
	}
}
