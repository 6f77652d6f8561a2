package gyre

import (
	"bytes"
	"strings"
	"testing"
)

func TestParseFailpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want failpoint
		err  string
	}{
		{"", failpoint{}, ""},
		{"vote", failpoint{name: FailVote}, ""},
		{"vote@20", failpoint{name: FailVote, iter: 20}, ""},
		{"checkpoint@20:5000", failpoint{name: FailCheckpoint, iter: 20, bytes: 5000}, ""},
		{"checkpoint@3", failpoint{name: FailCheckpoint, iter: 3}, ""},
		{"vote@x", failpoint{}, "ITER a non-negative integer"},
		{"vote@-1", failpoint{}, "ITER a non-negative integer"},
		{"vote@20:5", failpoint{}, "only checkpoint takes :BYTES"},
		{"checkpoint@20:-1", failpoint{}, "only checkpoint takes :BYTES"},
		{"nope", failpoint{}, `unknown step "nope"`},
	} {
		got, err := parseFailpoint(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("parseFailpoint(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("parseFailpoint(%q) = %v; want an error saying %q", tc.in, err, tc.err)
		}
	}
}

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
