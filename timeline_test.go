package gyre_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
)

// TestTimeline runs 2 workers over real QUIC, each writing a timeline,
// through iterations with forward and backward spans and an allreduce,
// then parses both files: each is valid trace-event JSON with its own
// process named after its rank, the trainer, collectives and buckets
// threads, a forward, backward and boundary span per iteration in order,
// the allreduces with their bytes, and the gradient buckets named for
// their tensors, with their phases and the trainer's waits.
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
		data, grad := make([]float32, size/4), make([]float32, 1024)
		return iterate(ctx, w, iters, func() error {
			end := w.StartSpan(gyre.SpanForward)
			time.Sleep(time.Millisecond)
			end()
			end = w.StartSpan(gyre.SpanBackward)
			defer end()
			w.AllReduceAsync(ctx, "layer.w", grad)
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
		allreduces, transfers, buckets, phases, waits := 0, 0, 0, 0, 0
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
			case e.Ph == "X" && e.Name == "state transfer":
				transfers++
			case e.Ph == "X" && e.Name == "wait":
				waits++
			case e.Ph == "X" && e.Name == "bucket layer.w":
				buckets++
				if e.Tid != threads["gradient buckets"] || fmt.Sprint(e.Args["tensors"]) != "[layer.w]" || e.Args["bytes"] != float64(4096) {
					t.Errorf("rank %d: bucket event %+v", r, e)
				}
			case e.Ph == "X" && e.Tid == threads["gradient buckets"] && (e.Name == "pack" || e.Name == "allreduce"):
				phases++
			case e.Ph == "X" && e.Name == "allreduce" && e.Args["bytes"] == float64(size):
				allreduces++
				if e.Tid != threads["collectives"] || e.Args["algorithm"] != "ring" {
					t.Errorf("rank %d: allreduce event %+v", r, e)
				}
			}
		}
		if len(threads) != 3 {
			t.Errorf("rank %d: threads %v, want trainer, collectives and gradient buckets", r, threads)
		}
		if buckets != iters || phases != 2*iters || waits != iters {
			t.Errorf("rank %d: %d buckets, %d pack and allreduce phases, %d waits; want %d, %d and %d", r, buckets, phases, waits, iters, 2*iters, iters)
		}
		if transfers == 0 {
			t.Errorf("rank %d: no state transfer span: Join broadcasts rank 0's state", r)
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

// TestTimelineMerge runs 2 workers twice, first with true clocks and then
// with rank 1's timeline 250 ms ahead, and merges each pair of files: the
// merge finds the skew, and after it the boundaries of the two ranks lie
// as close (median over iterations) as in the run without skew, or within
// 5 ms.
func TestTimelineMerge(t *testing.T) {
	const skew = 250 * time.Millisecond
	unskewed := mergedBoundaryGap(t, 0)
	skewed := mergedBoundaryGap(t, skew)
	t.Logf("median boundary gap after the merge: %v without skew, %v with rank 1 %v ahead (shift %v)",
		unskewed.gap, skewed.gap, skew, skewed.shift)
	if d := skewed.shift + skew; d < -5*time.Millisecond || d > 5*time.Millisecond {
		t.Errorf("the merge shifted rank 1 by %v; its clock was %v ahead", skewed.shift, skew)
	}
	if limit := max(5*time.Millisecond, unskewed.gap); skewed.gap > limit {
		t.Errorf("boundaries %v apart after merging the skewed run, want within %v", skewed.gap, limit)
	}
}

type mergeResult struct{ gap, shift time.Duration }

// mergedBoundaryGap runs 2 workers for 20 iterations, rank 1's timeline
// skewed by skew, merges the two timelines and returns the median gap
// between the ranks' boundary ends in the merged file, and rank 1's shift.
func mergedBoundaryGap(t *testing.T, skew time.Duration) mergeResult {
	t.Helper()
	const n, iters = 2, 20
	dir := t.TempDir()
	path := func(r int) string { return filepath.Join(dir, fmt.Sprintf("t.%d.json", r)) }
	c := gyretest.MakeCluster(t, gyretest.Options{N: n,
		Config: func(r int, c *gyre.Config) { c.Timeline = path(r) },
		Options: func(r int) []gyre.Option {
			if r == 1 {
				return []gyre.Option{gyre.WithTimelineSkew(skew)}
			}
			return nil
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := errors.Join(c.Run(func(_ int, w *gyre.Worker) error { return iterate(ctx, w, iters, nil) })...); err != nil {
		t.Fatal(err)
	}
	var files []obs.TraceFile
	for r, w := range c.Workers {
		w.Close()
		f, err := os.Open(path(r))
		if err != nil {
			t.Fatal(err)
		}
		tf, err := obs.ReadTrace(path(r), f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, tf)
	}
	merged, offsets, err := obs.Merge(files)
	if err != nil {
		t.Fatal(err)
	}
	ends := map[float64]map[float64]float64{} // pid → iter → end
	for _, raw := range merged {
		var e struct {
			Name string             `json:"name"`
			Ph   string             `json:"ph"`
			Ts   float64            `json:"ts"`
			Dur  float64            `json:"dur"`
			Pid  float64            `json:"pid"`
			Args map[string]float64 `json:"args"`
		}
		json.Unmarshal(raw, &e)
		if e.Ph == "X" && e.Name == "boundary" {
			if ends[e.Pid] == nil {
				ends[e.Pid] = map[float64]float64{}
			}
			ends[e.Pid][e.Args["iter"]] = e.Ts + e.Dur
		}
	}
	var gaps []float64
	for iter, end0 := range ends[0] {
		if end1, ok := ends[1][iter]; ok {
			gaps = append(gaps, math.Abs(end1-end0))
		}
	}
	if len(gaps) < iters {
		t.Fatalf("the merged timeline has %d boundaries of both ranks, want %d", len(gaps), iters)
	}
	slices.Sort(gaps)
	return mergeResult{gap: time.Duration(gaps[len(gaps)/2] * 1e3), shift: time.Duration(offsets[1].Micros * 1e3)}
}
