package ring

import (
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
