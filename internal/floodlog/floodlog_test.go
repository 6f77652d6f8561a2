package floodlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// lines is a zerolog sink that keeps each line with the fake time it was
// written at.
type lines struct {
	mu   sync.Mutex
	at   []time.Time
	text []string
}

func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.at = append(l.at, time.Now())
	l.text = append(l.text, string(p))
	return len(p), nil
}

func (l *lines) snapshot() ([]time.Time, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]time.Time(nil), l.at...), append([]string(nil), l.text...)
}

func TestBurstThenSummary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &lines{}
		l := New(Config{Logger: zerolog.New(out), What: "connections to the data port"})
		defer l.Close()
		for i := range 1000 {
			host := []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"}[min(i%10, 2)]
			l.Refused(fmt.Sprintf("%s:%d", host, 40000+i), "refused", func(e *zerolog.Event) *zerolog.Event {
				return e.Err(errors.New("bad certificate"))
			})
		}
		_, text := out.snapshot()
		if len(text) != DefaultBurst {
			t.Fatalf("%d lines during the burst, want %d:\n%s", len(text), DefaultBurst, strings.Join(text, ""))
		}
		time.Sleep(DefaultWindow)
		synctest.Wait()
		_, text = out.snapshot()
		if len(text) != DefaultBurst+1 {
			t.Fatalf("%d lines after the window, want the burst and one summary:\n%s", len(text), strings.Join(text, ""))
		}
		var sum struct {
			Refused int      `json:"refused"`
			Top     []string `json:"top_sources"`
			Message string   `json:"message"`
		}
		if err := json.Unmarshal([]byte(text[DefaultBurst]), &sum); err != nil {
			t.Fatal(err)
		}
		// 1000 refusals, 8 in 10 from 10.0.0.3; the first of 10.0.0.1 and
		// 10.0.0.2 were logged.
		want := []string{"10.0.0.3 (800)", "10.0.0.1 (99)", "10.0.0.2 (99)"}
		if sum.Refused != 998 || strings.Join(sum.Top, ",") != strings.Join(want, ",") ||
			!strings.Contains(sum.Message, "refused 998 more connections to the data port in the last 10s") {
			t.Fatalf("summary %+v, want 998 refused from %v", sum, want)
		}
		// A new window logs again.
		l.Refused("10.0.0.9:1", "refused", nil)
		if _, text = out.snapshot(); len(text) != DefaultBurst+2 || !strings.Contains(text[len(text)-1], "10.0.0.9:1") {
			t.Fatalf("the next window's first refusal was not logged:\n%s", strings.Join(text, ""))
		}
	})
}

// TestSustainedFlood: a minute of 1000 refusals a second, of three kinds,
// never writes more than 10 lines in any 10 s.
func TestSustainedFlood(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		out := &lines{}
		l := New(Config{Logger: zerolog.New(out), What: "connections"})
		for range 60_000 {
			l.Refused("10.0.0.1:5", []string{"a", "b", "c"}[rand.IntN(3)], nil)
			time.Sleep(time.Millisecond)
		}
		l.Close()
		at, text := out.snapshot()
		total := 0
		for _, s := range text {
			var v struct {
				Refused int `json:"refused"`
			}
			json.Unmarshal([]byte(s), &v)
			total += max(v.Refused, 1)
		}
		if total != 60_000 {
			t.Fatalf("the lines account for %d refusals, want 60000", total)
		}
		for i := range at {
			n := 0
			for j := i; j < len(at) && at[j].Sub(at[i]) < 10*time.Second; j++ {
				n++
			}
			if n > 10 {
				t.Fatalf("%d lines in the 10 s from %v", n, at[i])
			}
		}
		if len(text) > 7*(DefaultTotal+1) {
			t.Fatalf("%d lines in a minute", len(text))
		}
	})
}

// TestManySources: the sources counted in a window are bounded.
func TestManySources(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l := New(Config{Logger: zerolog.Nop()})
		defer l.Close()
		for i := range 10_000 {
			l.Refused(fmt.Sprintf("10.%d.%d.%d:1", i>>16, (i>>8)&255, i&255), "refused", nil)
		}
		l.mu.Lock()
		n := len(l.sources)
		l.mu.Unlock()
		if n > maxSources+1 {
			t.Fatalf("%d sources kept, at most %d", n, maxSources+1)
		}
	})
}

func TestCloseFlushes(t *testing.T) {
	out := &lines{}
	l := New(Config{Logger: zerolog.New(out), What: "x", Burst: 1})
	l.Refused("h:1", "refused", nil)
	l.Refused("h:2", "refused", nil)
	l.Close()
	l.Close()
	l.Refused("h:3", "refused", nil)
	if _, text := out.snapshot(); len(text) != 2 || !strings.Contains(text[1], `"refused":1`) {
		t.Fatalf("lines %q, want one refusal and one summary of 1", text)
	}
}

// TestKindsShareTheTotal: each kind has its burst, and all share the
// total, so a refusal of a rare kind still shows amid a flood of another.
func TestKindsShareTheTotal(t *testing.T) {
	out := &lines{}
	l := New(Config{Logger: zerolog.New(out)})
	defer l.Close()
	for range 100 {
		l.Refused("10.0.0.1:1", "junk", nil)
	}
	l.Refused("10.0.0.2:1", "wrong key", nil)
	for _, k := range []string{"x", "y", "z"} {
		l.Refused("10.0.0.3:1", k, nil)
	}
	_, text := out.snapshot()
	got := strings.Join(text, "")
	if len(text) != DefaultTotal || strings.Count(got, `"junk"`) != DefaultBurst || !strings.Contains(got, "wrong key") {
		t.Fatalf("lines:\n%s\nwant %d junk, the wrong key, and %d in all", got, DefaultBurst, DefaultTotal)
	}
}

// TestTimedOut: a handshake that timed out (a context deadline, a net
// timeout, as QUIC's handshake and idle timeouts are) is told from one
// that failed otherwise.
func TestTimedOut(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{context.DeadlineExceeded, true},
		{fmt.Errorf("handshake: %w", context.DeadlineExceeded), true},
		{&net.OpError{Op: "read", Err: os.ErrDeadlineExceeded}, true},
		{errors.New("remote error: tls: bad certificate"), false},
		{io.EOF, false},
		{context.Canceled, false},
	} {
		if got := TimedOut(tc.err); got != tc.want {
			t.Errorf("TimedOut(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
