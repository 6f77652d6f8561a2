package gyre_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// TestAutotuneSameChoice: 3 workers over real QUIC measure their links at
// Join, and every one fits the same cost model from the gathered table
// and so chooses the same size from which the ring runs, and the same
// compression at every size under Compress auto. Allreduces on either
// side of the threshold then run, the same algorithm on every rank (ranks
// that chose differently fail with a mismatch), to the exact sum.
func TestAutotuneSameChoice(t *testing.T) {
	const n = 3
	c := gyretest.MakeCluster(t, gyretest.Options{N: n, Transport: gyretest.QUIC,
		Config: func(_ int, c *gyre.Config) { c.Compress = gyre.CompressAuto }})
	views := make([]gyre.View, n)
	for r, w := range c.Workers {
		views[r] = w.View()
	}
	t.Logf("rank 0: %+v", views[0].CostModel)
	if views[0].CostModel == ring.DefaultCostModel {
		t.Fatalf("the view kept ring.DefaultCostModel: nothing was measured")
	}
	for r, v := range views {
		if v.CostModel != views[0].CostModel || v.SmallBytes != views[0].SmallBytes {
			t.Fatalf("rank %d: model %+v, ring from %d bytes; rank 0: %+v, %d", r, v.CostModel, v.SmallBytes,
				views[0].CostModel, views[0].SmallBytes)
		}
	}
	if want := views[0].CostModel.Threshold(n); views[0].SmallBytes != want {
		t.Fatalf("ring from %d bytes, the model's threshold is %d", views[0].SmallBytes, want)
	}
	compressions := make([][]wire.DType, n)
	for r, w := range c.Workers {
		comm, err := w.Comm()
		if err != nil {
			t.Fatal(err)
		}
		for size := 4 << 10; size <= 256<<20; size *= 4 {
			compressions[r] = append(compressions[r], comm.AutoCompression(size))
		}
		if !slices.Equal(compressions[r], compressions[0]) {
			t.Fatalf("compression by size from 4 KiB: rank %d %v, rank 0 %v", r, compressions[r], compressions[0])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	small := views[0].SmallBytes
	sizes := []int{4 << 10, min(max(small/2, 4), 8<<20) &^ 3, min(max(small, 4), 8<<20) &^ 3}
	errs := c.Run(func(r int, w *gyre.Worker) error {
		comm, err := w.Comm()
		if err != nil {
			return err
		}
		for _, size := range sizes {
			data := make([]int32, size/4)
			for i := range data {
				data[i] = int32(r + i)
			}
			if err := ring.AllReduce(ctx, comm, wire.OpSum, data); err != nil {
				return err
			}
			for i, v := range data {
				if want := int32(n*i + n*(n-1)/2); v != want {
					return errors.New("wrong sum")
				}
			}
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("allreduces of %v bytes around the threshold %d: %v", sizes, small, err)
	}
}

// TestAutotuneSlowLink: a 1 ms delay on the link between two workers
// (mem transport) shows in the measured latency and moves the size from
// which the ring runs up, past 1 MiB, where with the plain link it is far
// lower; with Algo pinned to the ring nothing is probed and the ring runs
// at every size.
func TestAutotuneSlowLink(t *testing.T) {
	slowLinks := func(net *mem.Network, ids []transport.PeerID) {
		net.SetLink(ids[0], ids[1], mem.Link{Delay: time.Millisecond})
		net.SetLink(ids[1], ids[0], mem.Link{Delay: time.Millisecond})
	}
	plain := gyretest.MakeCluster(t, gyretest.Options{N: 2}).Workers[0].View()
	slow := gyretest.MakeCluster(t, gyretest.Options{N: 2, Links: slowLinks}).Workers[1].View()
	t.Logf("plain %+v from %d bytes; slow %+v from %d bytes", plain.CostModel, plain.SmallBytes, slow.CostModel, slow.SmallBytes)
	if slow.CostModel.Alpha < 1e-3 || plain.CostModel.Alpha >= 1e-3 {
		t.Errorf("latency %v with the delay, %v without: want at least 1 ms and under it", slow.CostModel.Alpha, plain.CostModel.Alpha)
	}
	if slow.SmallBytes <= plain.SmallBytes || slow.SmallBytes <= 1<<20 {
		t.Errorf("the ring runs from %d bytes over the slow link, %d over the plain one: want it higher, past 1 MiB",
			slow.SmallBytes, plain.SmallBytes)
	}
	pinned := gyretest.MakeCluster(t, gyretest.Options{N: 2, Links: slowLinks,
		Config: func(_ int, c *gyre.Config) { c.Algo = gyre.AlgoRing }}).Workers[0].View()
	if pinned.SmallBytes != 0 || pinned.CostModel != ring.DefaultCostModel {
		t.Errorf("Algo ring: the ring from %d bytes, model %+v; want 0 and no probe (DefaultCostModel)", pinned.SmallBytes, pinned.CostModel)
	}
}

// TestAutotuneStripes: two workers over real QUIC, with shared memory off
// so that their link is a network link, probe it over one connection and
// over several, and every rank chooses the same stripes for the data
// channel, 1 or probe's AutoStripes, which the transport then uses. The
// links are probed again every 4 iterations, each time reopening the data
// channel on both sides, and the training goes on through them, with
// gradients large enough to be striped, to identical state. With Stripes
// pinned, nothing is chosen and the pinned count is used.
func TestAutotuneStripes(t *testing.T) {
	for _, pinned := range []int{gyre.StripesAuto, 2} {
		t.Run(fmt.Sprint("stripes=", pinned), func(t *testing.T) {
			models := make([]*toy, 2)
			c := gyretest.MakeCluster(t, gyretest.Options{N: 2, Transport: gyretest.QUIC,
				Config: func(_ int, c *gyre.Config) {
					c.SharedMemory, c.Stripes, c.GlobalBatch = gyre.SharedMemoryOff, pinned, 40
				},
				Options: func(int) []gyre.Option { return []gyre.Option{gyre.WithReprobeEvery(4)} },
				State: func(r int) *gyre.State {
					models[r] = newToy()
					return models[r].state()
				}})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			stripes := make([][]int, 2) // per rank, per iteration
			errs := c.Run(func(r int, w *gyre.Worker) error {
				comm, err := w.Comm()
				if err != nil {
					return err
				}
				big := make([]float32, 1<<20) // 4 MiB: striped chunks
				for w.Iter() < 10 {
					stripes[r] = append(stripes[r], w.View().Stripes)
					for i := range big {
						big[i] = float32(r + i%7)
					}
					if err := ring.AllReduce(ctx, comm, wire.OpSum, big); err != nil {
						return err
					}
					for i, v := range big {
						if want := float32(2*(i%7) + 1); v != want {
							return fmt.Errorf("iteration %d: element %d is %v, want %v", w.Iter(), i, v, want)
						}
					}
					if err := trainStep(ctx, w, models[r]); err != nil {
						return err
					}
				}
				return w.Leave(ctx)
			})
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			t.Logf("stripes by iteration: %v", stripes[0])
			for it, k := range stripes[0] {
				if stripes[1][it] != k {
					t.Fatalf("iteration %d: rank 1 stripes %d, rank 0 %d", it, stripes[1][it], k)
				}
				switch {
				case pinned != gyre.StripesAuto && k != pinned:
					t.Fatalf("iteration %d: %d stripes, pinned to %d", it, k, pinned)
				case pinned == gyre.StripesAuto && k != 1 && k != 4:
					t.Fatalf("iteration %d: %d stripes, want 1 or 4", it, k)
				}
			}
			c.EnsureSameState(t)
		})
	}
}
