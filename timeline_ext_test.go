package gyre_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
)

// TestTimeline runs 2 workers over real QUIC, each writing a timeline,
// through iterations with forward and backward spans and an allreduce,
// then parses both files: each is valid trace-event JSON with its own
// process named after its rank, the trainer and collectives threads, a
// forward, backward and boundary span per iteration in order, and the
// allreduces with their bytes.
func TestTimeline(t *testing.T) {
	const n, iters, size = 2, 3, 64 << 10
	dir := t.TempDir()
	path := func(r int) string { return filepath.Join(dir, fmt.Sprintf("timeline.%d.json", r)) }
	c := gyretest.MakeCluster(t, gyretest.Options{N: n, Transport: gyretest.QUIC,
		Config: func(r int, c *gyre.Config) { c.Timeline, c.Algo = path(r), gyre.AlgoRing }})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := c.Run(func(r int, w *gyre.Worker) error {
		comm, err := w.Comm()
		if err != nil {
			return err
		}
		data := make([]float32, size/4)
		return iterate(ctx, w, iters, func() error {
			end := w.StartSpan(gyre.SpanForward)
			time.Sleep(time.Millisecond)
			end()
			end = w.StartSpan(gyre.SpanBackward)
			defer end()
			return ring.AllReduce(ctx, comm, wire.OpSum, data)
		})
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	for _, w := range c.Workers {
		w.Close() // completes the timeline
	}
	for r := range n {
		b, err := os.ReadFile(path(r))
		if err != nil {
			t.Fatal(err)
		}
		var events []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			Pid  int            `json:"pid"`
			Tid  int            `json:"tid"`
			Args map[string]any `json:"args"`
		}
		if err := json.Unmarshal(b, &events); err != nil {
			t.Fatalf("rank %d's timeline is not JSON: %v\n%s", r, err, b)
		}
		threads := map[string]int{}
		var order []string
		allreduces := 0
		for _, e := range events {
			if e.Pid != r {
				t.Fatalf("rank %d's timeline has an event of process %d: %+v", r, e.Pid, e)
			}
			switch {
			case e.Ph == "M" && e.Name == "process_name":
				if want := fmt.Sprintf("rank %d (", r); len(e.Args["name"].(string)) < len(want) || e.Args["name"].(string)[:len(want)] != want {
					t.Errorf("rank %d's process is named %q", r, e.Args["name"])
				}
			case e.Ph == "M" && e.Name == "thread_name":
				threads[e.Args["name"].(string)] = e.Tid
			case e.Ph == "X" && e.Dur < 0:
				t.Errorf("rank %d: span %s has a negative duration", r, e.Name)
			case e.Ph == "X" && (e.Name == "forward" || e.Name == "backward" || e.Name == "boundary"):
				order = append(order, e.Name)
				if e.Tid != threads["trainer"] {
					t.Errorf("rank %d: %s is not on the trainer's thread", r, e.Name)
				}
			case e.Ph == "X" && e.Name == "allreduce" && e.Args["bytes"] == float64(size):
				allreduces++
				if e.Tid != threads["collectives"] || e.Args["algorithm"] != "ring" {
					t.Errorf("rank %d: allreduce event %+v", r, e)
				}
			}
		}
		if len(threads) != 2 {
			t.Errorf("rank %d: threads %v, want trainer and collectives", r, threads)
		}
		if allreduces != iters {
			t.Errorf("rank %d: %d allreduces of %d bytes in the timeline, want %d", r, allreduces, size, iters)
		}
		// Spans are written as they end: forward, backward, boundary.
		for i := range iters {
			if len(order) < 3*(i+1) || order[3*i] != "forward" || order[3*i+1] != "backward" || order[3*i+2] != "boundary" {
				t.Fatalf("rank %d: trainer spans %v, want forward, backward, boundary %d times", r, order, iters)
			}
		}
	}
}
