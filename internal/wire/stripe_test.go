package wire

import "testing"

func TestStripePart(t *testing.T) {
	sizes := []uint64{0, 1, StripeMin - 1, StripeMin, StripeMin + 1, 1 << 20, 64<<20 + 7}
	for _, k := range []int{1, 2, 3, 4, 7, 255} {
		for _, n := range sizes {
			used := StripesUsed(n, k)
			if want := map[bool]int{true: k, false: 1}[k > 1 && n >= StripeMin]; used != want {
				t.Fatalf("StripesUsed(%d, %d) = %d, want %d", n, k, used, want)
			}
			var next uint64
			var lens []uint64
			for s := range k {
				lo, hi := StripePart(n, k, s)
				if s >= used {
					if lo != hi {
						t.Fatalf("StripePart(%d, %d, %d) = [%d,%d), want empty", n, k, s, lo, hi)
					}
					continue
				}
				if lo != next || hi < lo {
					t.Fatalf("StripePart(%d, %d, %d) = [%d,%d), want to start at %d", n, k, s, lo, hi, next)
				}
				next = hi
				lens = append(lens, hi-lo)
			}
			if next != n {
				t.Fatalf("parts of %d over %d stripes end at %d", n, k, next)
			}
			for _, l := range lens {
				if l+1 < lens[0] || l > lens[0] {
					t.Fatalf("parts of %d over %d stripes are uneven: %v", n, k, lens)
				}
			}
		}
	}
}
