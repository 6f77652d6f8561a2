package balance

import (
	"errors"
	"slices"
	"testing"
)

func TestStart(t *testing.T) {
	fast := Model{RateMicro: 300e6} // 300 samples/s
	slow := Model{RateMicro: 100e6} // 100 samples/s
	for _, tc := range []struct {
		name string
		ws   []Worker
		B    int
		want []int
	}{
		{"no model: equal, the first ones one more", []Worker{{}, {}, {}}, 10, []int{4, 3, 3}},
		{"every model: Solve's", []Worker{{Model: fast}, {Model: slow}}, 400, []int{300, 100}},
		// The joiner takes 600/3; the fast and the slow split the other
		// 400 as Solve would.
		{"a joiner gets the equal share", []Worker{{Model: fast}, {Model: slow}, {}}, 600, []int{300, 100, 200}},
		{"a joiner's equal share within its bounds", []Worker{{Model: fast}, {Max: 50}, {Model: slow}}, 600, []int{413, 50, 137}}, // 550 at 3:1, the tie to the lower index,
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Start(tc.ws, tc.B)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("Start = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestStartInfeasible(t *testing.T) {
	// The joiner's equal share leaves the known worker more than its cap.
	_, err := Start([]Worker{{Model: Model{RateMicro: 1e6}, Max: 10}, {Max: 50}}, 100)
	if !errors.Is(err, ErrInfeasible) {
		t.Fatalf("Start = %v, want ErrInfeasible", err)
	}
}
