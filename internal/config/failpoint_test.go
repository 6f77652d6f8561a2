package config

import (
	"strings"
	"testing"
)

func TestParseFailpoint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Failpoint
		err  string
	}{
		{"", Failpoint{}, ""},
		{"vote", Failpoint{Name: FailVote}, ""},
		{"vote@20", Failpoint{Name: FailVote, Iter: 20}, ""},
		{"checkpoint@20:5000", Failpoint{Name: FailCheckpoint, Iter: 20, Bytes: 5000}, ""},
		{"checkpoint@3", Failpoint{Name: FailCheckpoint, Iter: 3}, ""},
		{"vote@x", Failpoint{}, "ITER a non-negative integer"},
		{"vote@-1", Failpoint{}, "ITER a non-negative integer"},
		{"vote@20:5", Failpoint{}, "only checkpoint takes :BYTES"},
		{"checkpoint@20:-1", Failpoint{}, "only checkpoint takes :BYTES"},
		{"nope", Failpoint{}, `unknown step "nope"`},
	} {
		got, err := ParseFailpoint(tc.in)
		switch {
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("ParseFailpoint(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseFailpoint(%q) = %v; want an error saying %q", tc.in, err, tc.err)
		}
	}
}
