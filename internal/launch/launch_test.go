package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// syncBuffer is a bytes.Buffer safe for the launcher's concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runSh(t *testing.T, n int, script string, adjust func(*Options)) (string, string, error) {
	t.Helper()
	var out, errb syncBuffer
	o := Options{
		N:      n,
		Argv:   []string{"sh", "-c", script},
		Env:    func(r int) []string { return append(os.Environ(), fmt.Sprintf("RANK=%d", r)) },
		Stdout: &out,
		Stderr: &errb,
		Grace:  2 * time.Second,
	}
	if adjust != nil {
		adjust(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, o)
	return out.String(), errb.String(), err
}

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	sort.Strings(lines)
	return lines
}

func TestRunPrefixesEveryLine(t *testing.T) {
	defer goleak.VerifyNone(t)
	out, errs, err := runSh(t, 3, `echo "out $RANK"; echo "err $RANK" >&2; printf "partial $RANK"`, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"[0] out 0", "[0] partial 0", "[1] out 1", "[1] partial 1", "[2] out 2", "[2] partial 2"}
	if got := sortedLines(out); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("stdout lines %q, want %q", got, want)
	}
	if got := sortedLines(errs); strings.Join(got, "|") != "[0] err 0|[1] err 1|[2] err 2" {
		t.Fatalf("stderr lines %q", got)
	}
}

func TestRunStopsTheOthersWhenARankFails(t *testing.T) {
	defer goleak.VerifyNone(t)
	start := time.Now()
	_, _, err := runSh(t, 4, `if [ "$RANK" = 2 ]; then sleep 0.2; exit 3; fi; exec sleep 30`, nil)
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 2 || re.Code != 3 || re.ExitCode() != 3 {
		t.Fatalf("Run = %v, want rank 2 failing with status 3", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v: the other ranks were not stopped", d)
	}
}

func TestRunKillsRanksThatIgnoreSIGTERM(t *testing.T) {
	defer goleak.VerifyNone(t)
	start := time.Now()
	_, _, err := runSh(t, 2, `trap "" TERM; if [ "$RANK" = 0 ]; then exit 5; fi; while :; do sleep 0.1; done`, nil)
	var re *RankError
	if !errors.As(err, &re) || re.Rank != 0 || re.Code != 5 {
		t.Fatalf("Run = %v, want rank 0 with status 5", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("took %v: the rank ignoring SIGTERM was not killed after the grace period", d)
	}
}

func TestRunCancelStopsEveryRank(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	err := Run(ctx, Options{N: 3, Argv: []string{"sleep", "30"}, Env: func(int) []string { return os.Environ() },
		Stdout: &out, Stderr: &out, Grace: time.Second})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("Run = %v after %v, want a prompt context.Canceled", err, time.Since(start))
	}
}

func TestRunLogDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	_, _, err := runSh(t, 2, `echo "hello $RANK"; echo "oops $RANK" >&2`, func(o *Options) { o.LogDir = dir })
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", r)))
		if err != nil {
			t.Fatal(err)
		}
		if got := sortedLines(string(b)); strings.Join(got, "|") != fmt.Sprintf("hello %d|oops %d", r, r) {
			t.Fatalf("rank %d log: %q", r, got)
		}
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	if _, _, err := runSh(t, 0, "true", nil); err == nil {
		t.Fatal("0 ranks accepted")
	}
	if _, _, err := runSh(t, 1, "", func(o *Options) { o.Argv = nil }); err == nil {
		t.Fatal("empty command accepted")
	}
	_, _, err := runSh(t, 2, "", func(o *Options) { o.Argv = []string{"/nonexistent/program"} })
	if err == nil || !strings.Contains(err.Error(), "start rank 0") {
		t.Fatalf("missing program: %v", err)
	}
}

func TestPrefixWriterBoundsPartialLines(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{prefix: []byte("[7] "), out: &out}
	p.Write(bytes.Repeat([]byte("x"), maxLine+10))
	if len(p.line) != 0 || !strings.HasPrefix(out.String(), "[7] xxx") {
		t.Fatalf("a long partial line was held: %d bytes buffered", len(p.line))
	}
}
