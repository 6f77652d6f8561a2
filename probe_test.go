package gyre

import (
	"fmt"
	"testing"
)

// TestProbePartners: in the probe tournament every pair of members meets
// exactly once, partners agree, and nobody has two partners in a round.
func TestProbePartners(t *testing.T) {
	for n := 1; n <= 17; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			met := map[[2]int]int{}
			for k := range probeRounds(n) {
				for r := range n {
					p := probePartner(n, r, k)
					switch {
					case p == -1:
						continue
					case p < 0 || p >= n || p == r:
						t.Fatalf("round %d: rank %d's partner is %d", k, r, p)
					case probePartner(n, p, k) != r:
						t.Fatalf("round %d: rank %d meets %d, who meets %d", k, r, p, probePartner(n, p, k))
					}
					if r < p {
						met[[2]int{r, p}]++
					}
				}
			}
			if want := n * (n - 1) / 2; len(met) != want {
				t.Fatalf("%d pairs met, want %d", len(met), want)
			}
			for pair, times := range met {
				if times != 1 {
					t.Fatalf("pair %v met %d times", pair, times)
				}
			}
		})
	}
}
