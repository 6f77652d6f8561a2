package shares

import (
	"testing"

	"github.com/gyre-ml/gyre/balance"
)

// TestFitRoundTrip: a member's fit, as syncFits broadcasts it, decodes
// to the same fit, and zero words to none.
func TestFitRoundTrip(t *testing.T) {
	for _, f := range []balance.Worker{
		{Model: balance.Model{FixedNs: 1, RateMicro: 2, NoisePpm: 3, Flat: true}, Min: 4, Max: 5},
		{Model: balance.Model{RateMicro: 7}, Min: 1},
		{Min: 1}, // bounds, no model yet
	} {
		words := make([]int64, fitWords)
		encodeFit(words, f)
		if got, ok := decodeFit(words); !ok || got != f {
			t.Fatalf("%+v: decoded %+v, %v", f, got, ok)
		}
	}
	if _, ok := decodeFit(make([]int64, fitWords)); ok {
		t.Fatal("zero words decoded as a fit")
	}
}
