package engine

import (
	"bytes"
	"testing"
)

// TestDieAfter: the first n bytes get through, then the worker dies,
// however the writes are cut.
func TestDieAfter(t *testing.T) {
	for _, n := range []int64{0, 1, 5, 9, 10} {
		var out bytes.Buffer
		died := 0
		d := &dieAfter{w: &out, n: n, die: func() { died++ }}
		for _, p := range []string{"abc", "defg", "hij"} {
			if died > 0 {
				break
			}
			d.Write([]byte(p))
		}
		wantDied := 1
		if n == 10 {
			wantDied = 0 // everything fits: no byte past n
		}
		if want := "abcdefghij"[:n]; out.String() != want || died != wantDied {
			t.Errorf("n=%d: wrote %q, died %d times; want %q and %d deaths", n, out.String(), died, want, wantDied)
		}
	}
}
