package transporttest

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
)

// Start makes a transport for a test: newT(cfg) after adjust, if not nil,
// has changed cfg. It fails tb if newT does, and closes the transport when
// the test ends. The transports' node factories are built on it, with a
// func(*Config) adjusting their test defaults.
func Start[C any, T io.Closer](tb testing.TB, cfg C, adjust func(*C), newT func(C) (T, error)) T {
	tb.Helper()
	if adjust != nil {
		adjust(&cfg)
	}
	tr, err := newT(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	return tr
}

// NewCA returns the cluster CA of a fresh secret. Two calls make two
// clusters that do not trust each other.
func NewCA(tb testing.TB) *secret.CA {
	tb.Helper()
	s, err := secret.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := s.CA()
	if err != nil {
		tb.Fatal(err)
	}
	return ca
}

// Issue mints a leaf of ca for name.
func Issue(tb testing.TB, ca *secret.CA, name string) *secret.Identity {
	tb.Helper()
	id, err := ca.Issue(name)
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// Logger returns the logger a test node gets by default: info and above
// (or GYRE_TEST_LOG_LEVEL's level, such as debug) written to the test's
// log, or nothing at all for a benchmark, where the log would bury the
// results.
func Logger(tb testing.TB) zerolog.Logger {
	if t, ok := tb.(*testing.T); ok {
		level := zerolog.InfoLevel
		if l, err := zerolog.ParseLevel(os.Getenv("GYRE_TEST_LOG_LEVEL")); err == nil && l != zerolog.NoLevel {
			level = l
		}
		return zerolog.New(zerolog.NewTestWriter(t)).Level(level)
	}
	return zerolog.Nop()
}

// LogBuffer is a zerolog sink that keeps what is written, for tests that
// assert on logs. It is safe for concurrent use.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// logWait bounds LogBuffer.Wait. Logging is asynchronous to the events
// tests trigger (handshakes fail and streams are refused on goroutines of
// their own), but not slow.
const logWait = 5 * time.Second

// Wait waits until the log contains every one of want, and fails tb,
// quoting the log, if that does not happen within a few seconds.
func (l *LogBuffer) Wait(tb testing.TB, want ...string) {
	tb.Helper()
	deadline := time.Now().Add(logWait)
	for {
		s := l.String()
		missing := ""
		for _, w := range want {
			if !strings.Contains(s, w) {
				missing = w
				break
			}
		}
		if missing == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("log lacks %q after %v; log:\n%s", missing, logWait, s)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// HeapObjectsBytes returns the bytes in live heap objects after a GC, for
// tests that check what hostile input can make a process allocate.
func HeapObjectsBytes() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// SizeName names a message size for a sub-benchmark: "4KiB", "1MiB",
// "100B". Sizes are rounded down to the largest unit they reach.
func SizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
