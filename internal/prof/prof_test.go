package prof

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"
)

func TestStartWritesEveryProfile(t *testing.T) {
	dir := t.TempDir()
	f := Files{CPU: filepath.Join(dir, "cpu"), Block: filepath.Join(dir, "block"), Trace: filepath.Join(dir, "trace")}
	stop, err := Start(f)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	mu.Lock()
	go func() { time.Sleep(10 * time.Millisecond); mu.Unlock() }()
	mu.Lock() // a blocking event for the block profile
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{f.CPU, f.Block, f.Trace} {
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() == 0 {
			t.Errorf("%s is empty", name)
		}
	}
}

func TestStartFailsOnABadPathAndStopsWhatItStarted(t *testing.T) {
	dir := t.TempDir()
	_, err := Start(Files{CPU: filepath.Join(dir, "cpu"), Trace: filepath.Join(dir, "missing", "trace")})
	if err == nil {
		t.Fatal("no error for a trace file in a missing directory")
	}
	// The CPU profile was stopped: a new one can start.
	stop, err := Start(Files{CPU: filepath.Join(dir, "cpu2")})
	if err != nil {
		t.Fatalf("the failed Start left the CPU profile running: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestWorkerEnvAndFromEnv(t *testing.T) {
	f := Files{CPU: "c.prof", Trace: "t.out"}
	env := f.WorkerEnv(3)
	if want := []string{EnvCPU + "=c.prof.3", EnvTrace + "=t.out.3"}; !slices.Equal(env, want) {
		t.Fatalf("WorkerEnv(3) = %q, want %q", env, want)
	}
	lookup := func(k string) (string, bool) {
		m := map[string]string{EnvCPU: "c.prof.3", EnvBlock: "b.3"}
		v, ok := m[k]
		return v, ok
	}
	got := Files{Block: "mine"}.FromEnv(lookup)
	if got != (Files{CPU: "c.prof.3", Block: "mine"}) {
		t.Fatalf("FromEnv = %+v: a flag must win over the environment", got)
	}
}
