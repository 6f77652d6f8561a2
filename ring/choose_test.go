package ring

import (
	"math"
	"testing"
)

func TestChoose(t *testing.T) {
	m := DefaultCostModel
	for _, n := range []int{2, 3, 4, 5, 7, 8, 16, 64, 256} {
		th := m.Threshold(n)
		if th <= 0 || th == math.MaxInt {
			t.Fatalf("n=%d: threshold %d", n, th)
		}
		t.Logf("n=%d: threshold %d B (%.0f KiB)", n, th, float64(th)/1024)
		for _, s := range []int{th / 2, th - 1, th, th + 1, 2 * th} {
			want := AlgoRing
			if m.RecursiveDoubling(n, s) < m.Ring(n, s) {
				want = AlgoRecursiveDoubling
			}
			if got := Choose(n, s, th); got != want {
				t.Errorf("n=%d size %d: Choose = %v, model prefers %v (ring %.1f µs, rd %.1f µs)",
					n, s, got, want, m.Ring(n, s)*1e6, m.RecursiveDoubling(n, s)*1e6)
			}
		}
	}
	// The crossovers DefaultCostModel's comment quotes.
	for n, kb := range map[int]float64{2: 80, 3: 15, 4: 107, 8: 160, 64: 683} {
		if got := float64(m.Threshold(n)) / 1000; math.Abs(got-kb) > 0.5 {
			t.Errorf("n=%d: threshold %.1f kB, comment says %.0f", n, got, kb)
		}
	}
	// And its claims about the benchmark sizes.
	for _, n := range []int{2, 3, 4, 5, 7, 8, 16, 64} {
		if Choose(n, 4<<10, m.Threshold(n)) != AlgoRecursiveDoubling || Choose(n, 1<<20, m.Threshold(n)) != AlgoRing {
			t.Errorf("n=%d: 4 KiB or 1 MiB gets the wrong algorithm", n)
		}
		if want := n != 3 && n != 5; (Choose(n, 64<<10, m.Threshold(n)) == AlgoRecursiveDoubling) != want {
			t.Errorf("n=%d: recursive doubling at 64 KiB is %v, comment says %v", n, !want, want)
		}
	}
	if got := m.Threshold(1); got != 0 {
		t.Errorf("Threshold(1) = %d, want 0", got)
	}
	if got := (CostModel{Alpha: 1e-5, Beta: 1e9, Gamma: math.Inf(1)}).Threshold(2); got != math.MaxInt {
		t.Errorf("free reduction at n=2: threshold %d, want MaxInt (recursive doubling always wins)", got)
	}
}
