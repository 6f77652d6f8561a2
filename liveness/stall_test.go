package liveness

import (
	"testing"
	"time"
)

// TestStallLog: gaps between ticks longer than the limit are stalls; the
// longest since a time counts, a later short one does not hide an earlier
// long one, and a stall still under way counts up to now.
func TestStallLog(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := stallLog{limit: 100 * time.Millisecond}
	if r := l.resumed(t0, 0); !r.IsZero() {
		t.Fatalf("resumed before any tick: %v, want none", r)
	}
	for _, ms := range []int{0, 50, 100, 150} { // ticks every 50 ms: no stall
		l.tick(at(ms))
	}
	if d := l.since(t0, at(160)); d != 0 {
		t.Fatalf("steady ticks: stalled %v, want 0", d)
	}
	l.tick(at(5150))                             // stopped for 5 s
	for _, ms := range []int{5200, 5450, 5500} { // a 250 ms hiccup after it
		l.tick(at(ms))
	}
	if d := l.since(at(1000), at(5510)); d != 5*time.Second {
		t.Errorf("since before the stall: %v, want the 5 s stall, not the later 250 ms one", d)
	}
	if d := l.since(at(5200), at(5510)); d != 250*time.Millisecond {
		t.Errorf("since after the stall: %v, want only the 250 ms one", d)
	}
	if d := l.since(at(5200), at(8500)); d != 3*time.Second {
		t.Errorf("a stall under way: %v, want the 3 s since the last tick", d)
	}
	if r := l.resumed(at(5510), 0); !r.Equal(at(5450)) {
		t.Errorf("resumed after the hiccup: %v, want its end %v", r, at(5450))
	}
	if r := l.resumed(at(5510), time.Second); !r.Equal(at(5150)) {
		t.Errorf("resumed from a stall of 1 s or more: %v, want the 5 s stall's end %v", r, at(5150))
	}
	if r := l.resumed(at(8500), time.Second); !r.Equal(at(8500)) {
		t.Errorf("resumed during a stall under way: %v, want now", r)
	}
	for ms := 5600; ms < 5600+(maxStalls+1)*200; ms += 200 { // maxStalls newer stalls
		l.tick(at(ms))
	}
	if d := l.since(at(1000), at(7210)); d != 200*time.Millisecond {
		t.Errorf("after %d newer stalls: %v, want the older ones forgotten", maxStalls, d)
	}
}
