package gyre_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// What a trainer written from README and godoc alone runs into first.

func quiet() *zerolog.Logger { return new(zerolog.Nop()) }

// closedPort returns a loopback address on which nothing listens.
func closedPort(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// envUnreachableSeed makes the test binary a worker joining through an
// unreachable seed with the default Logger (TestDefaultLoggerWarnsAtOnce).
const envUnreachableSeed = "GYRE_TEST_UNREACHABLE_SEED"

// childStarted is the child's first line on stderr.
const childStarted = "worker starting"

// TestDefaultLoggerWarnsAtOnce: an embedded worker that sets no Logger and
// whose seed is unreachable says so on stderr within 2 s, instead of
// waiting out JoinTimeout in silence. The worker is this test binary run
// again, so that its stderr is its own.
func TestDefaultLoggerWarnsAtOnce(t *testing.T) {
	if seed := os.Getenv(envUnreachableSeed); seed != "" {
		fmt.Fprintln(os.Stderr, childStarted) // the clock starts here, not at exec
		_, err := gyre.Join(context.Background(), gyre.Config{Key: gyretest.Key(t), Listen: "127.0.0.1:0",
			DataAddr: "127.0.0.1:0", Seeds: []string{seed}, JoinTimeout: 20 * time.Second})
		t.Log(err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDefaultLoggerWarnsAtOnce$")
	cmd.Env = append(os.Environ(), envUnreachableSeed+"="+closedPort(t))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var deadline <-chan time.Time // from the child's first line: exec and the race detector's start are not Join's
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatal("the worker ended without a warning on stderr")
			}
			if line == childStarted {
				start, deadline = time.Now(), time.After(2*time.Second)
			}
			if strings.Contains(line, "WRN") && strings.Contains(line, "no seed answers") {
				t.Logf("after %v: %s", time.Since(start).Round(time.Millisecond), line)
				return
			}
		case <-deadline:
			t.Fatal("no warning on stderr within 2 s of starting a worker whose seed is unreachable")
		case <-time.After(time.Minute):
			t.Fatal("the worker did not start within a minute")
		}
	}
}

// TestJoinSaysWhyItsWaitEnded: a Join cancelled while it waits (as on
// SIGTERM) says it was cancelled, not that JoinTimeout passed; one that
// JoinTimeout ends says that.
func TestJoinSaysWhyItsWaitEnded(t *testing.T) {
	seed := closedPort(t)
	join := func(ctx context.Context, timeout time.Duration) error {
		_, err := gyre.Join(ctx, gyre.Config{Key: gyretest.Key(t), Listen: "127.0.0.1:0", DataAddr: "127.0.0.1:0",
			Seeds: []string{seed}, JoinTimeout: timeout, Logger: quiet()})
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	err := join(ctx, time.Minute)
	if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "cancelled") || strings.Contains(err.Error(), "JoinTimeout") {
		t.Errorf("cancelled Join = %v; want context.Canceled, saying it was cancelled and not blaming JoinTimeout", err)
	}
	err = join(context.Background(), 300*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "gave up after JoinTimeout 300ms") {
		t.Errorf("timed-out Join = %v; want context.DeadlineExceeded naming JoinTimeout 300ms", err)
	}
}

// TestLoneWorkersNeedNoSecretOrPort: a worker alone, as an embedded
// trainer's first run makes it, needs no cluster secret and binds no port,
// so two with the same (zero) Config run side by side, as two lone
// `gyre train` runs do.
func TestLoneWorkersNeedNoSecretOrPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ws []*gyre.Worker
	for i := range 2 {
		w, err := gyre.Join(ctx, gyre.Config{Logger: quiet()})
		if err != nil {
			t.Fatalf("lone worker %d: Join = %v", i, err)
		}
		defer w.Close()
		ws = append(ws, w)
	}
	for i, w := range ws {
		vals := []float64{3}
		if err := w.Reduce(ctx, gyre.ReduceSum, vals); err != nil || vals[0] != 3 {
			t.Errorf("lone worker %d: Reduce = %v, %v; want 3", i, vals, err)
		}
		if _, err := w.Boundary(ctx); err != nil {
			t.Errorf("lone worker %d: Boundary = %v", i, err)
		}
	}
	if _, err := gyre.NewTransport(gyre.Config{DataAddr: "127.0.0.1:0"}); !errors.Is(err, gyre.ErrConfig) {
		t.Errorf("NewTransport without a secret = %v, want ErrConfig: a network transport needs one", err)
	}
}

// TestReduce: every worker ends with the sum, mean, max or min of every
// worker's values, each worker counting alike whatever its share.
func TestReduce(t *testing.T) {
	c := gyretest.Start(t, gyretest.Options{N: 3, Config: func(r int, cfg *gyre.Config) { cfg.Shares = []int{1, 5, 10} }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		op   gyre.ReduceOp
		want []float64
	}{
		{gyre.ReduceSum, []float64{3, 3, 0}},
		{gyre.ReduceMean, []float64{1, 1, 0}},
		{gyre.ReduceMax, []float64{2, 1, 0}},
		{gyre.ReduceMin, []float64{0, 1, -2}},
	} {
		err := errors.Join(c.Run(func(r int, w *gyre.Worker) error {
			vals := []float64{float64(r), 1, -float64(r)}
			if tc.op == gyre.ReduceSum || tc.op == gyre.ReduceMean {
				vals[2] = float64(r - 1) // sums to 0
			}
			if err := w.Reduce(ctx, tc.op, vals); err != nil {
				return err
			}
			for i := range vals {
				if math.Abs(vals[i]-tc.want[i]) > 1e-12 {
					t.Errorf("op %d rank %d: %v, want %v", tc.op, r, vals, tc.want)
					break
				}
			}
			return nil
		})...)
		if err != nil {
			t.Fatalf("op %d: %v", tc.op, err)
		}
	}
	if err := c.Workers[0].Reduce(ctx, gyre.ReduceOp(99), []float64{1}); err == nil {
		t.Error("Reduce with an unknown op succeeded")
	}
}

// TestCollectivesNameTheLostRank: after a worker crashes, AllGather64 and
// Reduce fail with a *PeerLostError naming its rank, as Wait and Boundary
// do, and a collective run on Comm matches gyre.ErrPeerLost and names the
// rank too.
func TestCollectivesNameTheLostRank(t *testing.T) {
	c := gyretest.Start(t, gyretest.Options{N: 3, Config: func(r int, cfg *gyre.Config) { cfg.PeerTimeout = 200 * time.Millisecond }})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.Kill(t, 2)
	for r, w := range c.Workers[:2] {
		_, err := w.AllGather64(ctx, []float64{1})
		var lost *gyre.PeerLostError
		if !errors.As(err, &lost) || lost.Rank != 2 || !errors.Is(err, gyre.ErrPeerLost) {
			t.Errorf("rank %d: AllGather64 = %v, want a *PeerLostError naming rank 2", r, err)
		}
	}
	for r, w := range c.Workers[:2] {
		err := w.Reduce(ctx, gyre.ReduceMax, []float64{1})
		var lost *gyre.PeerLostError
		if !errors.As(err, &lost) || lost.Rank != 2 {
			t.Errorf("rank %d: Reduce = %v, want a *PeerLostError naming rank 2", r, err)
		}
	}
	for r, w := range c.Workers[:2] {
		comm, err := w.Comm()
		if err != nil {
			t.Fatal(err)
		}
		err = ring.AllReduce(ctx, comm, wire.OpSum, []float64{1})
		var lost *ring.PeerLostError
		if !errors.Is(err, gyre.ErrPeerLost) || !errors.As(err, &lost) || lost.Rank != 2 ||
			!errors.Is(err, transport.ErrPeerGone) || !strings.Contains(err.Error(), "rank 2") {
			t.Errorf("rank %d: ring.AllReduce on Comm = %v, want an error matching gyre.ErrPeerLost naming rank 2", r, err)
		}
	}
}

// TestLogLinesCarryIDAndRank: every line a worker logs once it is in a
// view names the worker and its rank there, whichever component logs it
// (the worker, heartbeats, the transport, the ring), since launch's [N]
// prefix is only the launch index and a view change can renumber ranks.
func TestLogLinesCarryIDAndRank(t *testing.T) {
	logs := []*transporttest.LogBuffer{{}, {}, {}}
	c := gyretest.Start(t, gyretest.Options{N: 3, Config: func(r int, cfg *gyre.Config) {
		cfg.Logger = new(zerolog.New(logs[r]).Level(zerolog.DebugLevel))
		cfg.PeerTimeout = 200 * time.Millisecond
	}})
	// A crash makes the survivors' heartbeats, transport and ring log.
	c.Kill(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c.Run(func(r int, w *gyre.Worker) error {
		if r < 2 {
			w.AllGather64(ctx, []float64{1})
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond) // a heartbeat interval or two
	for r := range 2 {
		inView, checked := false, 0
		for _, line := range strings.Split(strings.TrimSpace(logs[r].String()), "\n") {
			var rec struct {
				ID      string `json:"id"`
				Rank    *int   `json:"rank"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("rank %d: %v in %q", r, err, line)
			}
			if !inView {
				inView = rec.Message == "joined"
				if !inView {
					continue // before the view: no rank yet
				}
			}
			checked++
			// One rank key: the ring adds its own, the others the hook's.
			if rec.ID != string(c.IDs[r]) || rec.Rank == nil || *rec.Rank != r || strings.Count(line, `"rank":`) != 1 {
				t.Errorf("rank %d logged %q without its id %s and rank %d, once", r, line, c.IDs[r], r)
			}
		}
		if checked < 2 {
			t.Errorf("rank %d logged %d lines in its view, want the crash's too:\n%s", r, checked, logs[r])
		}
	}
}
