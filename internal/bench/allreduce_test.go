package bench

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/ring/ringtest"
)

// TestRunAllReduceCompressed runs compressed sweeps over 8 in-process
// ranks, where the pattern's sums (up to 468) are not all representable in
// bf16, so the check must allow the rounding, and expects every row to
// check OK on every rank.
func TestRunAllReduceCompressed(t *testing.T) {
	const n = 8
	comms := ringtest.MemComms(t, n, nil)
	for _, compress := range []wire.DType{wire.DTypeBF16, wire.DTypeFP16} {
		for _, op := range []wire.Op{wire.OpSum, wire.OpAvg, wire.OpMax} {
			t.Run(fmt.Sprintf("%v/%v", compress, op), func(t *testing.T) {
				o := AllReduceOptions{Sizes: []int64{4 << 10, 256 << 10}, Iters: 1, Op: op,
					DType: wire.DTypeFloat32, Check: true, Compress: compress}
				reps := make([]AllReduceReport, n)
				errs := make([]error, n)
				var wg sync.WaitGroup
				for r, c := range comms {
					wg.Go(func() { reps[r], errs[r] = RunAllReduce(t.Context(), c, o) })
				}
				wg.Wait()
				for r := range n {
					if errs[r] != nil {
						t.Fatalf("rank %d: %v", r, errs[r])
					}
					for _, row := range reps[r].Rows {
						if row.Check != "OK" {
							t.Errorf("rank %d, %d bytes: check %s", r, row.SizeBytes, row.Check)
						}
					}
				}
				if reps[0].Compress != compress.String() {
					t.Errorf("report says compress %q, want %v", reps[0].Compress, compress)
				}
			})
		}
	}
}

// TestCheckCompressed checks that the compressed check still catches a
// wrong element: the tolerance is that of the wire format, not a blank
// cheque.
func TestCheckCompressed(t *testing.T) {
	const n, count = 4, 1000
	for _, compress := range []wire.DType{wire.DTypeBF16, wire.DTypeFP16} {
		buf := alignedBytes(count * 4)
		xs, _ := kernels.AsFloat32(buf)
		for i := range xs {
			xs[i] = float32(expected(wire.OpSum, n, i))
		}
		if !checkPattern(wire.DTypeFloat32, wire.OpSum, compress, buf, n) {
			t.Fatalf("%v: the exact result fails the check", compress)
		}
		xs[count/2] *= 1.1
		if checkPattern(wire.DTypeFloat32, wire.OpSum, compress, buf, n) {
			t.Errorf("%v: an element 10%% off passes the check", compress)
		}
	}
}

func TestAllReduceOptionsValidate(t *testing.T) {
	for _, tc := range []struct {
		o  AllReduceOptions
		ok bool
	}{
		{AllReduceOptions{DType: wire.DTypeFloat32}, true},
		{AllReduceOptions{DType: wire.DTypeInt32}, true},
		{AllReduceOptions{DType: wire.DTypeFloat32, Compress: wire.DTypeBF16}, true},
		{AllReduceOptions{DType: wire.DTypeFloat32, Compress: wire.DTypeFP16}, true},
		{AllReduceOptions{DType: wire.DTypeFloat64, Compress: wire.DTypeBF16}, false},
		{AllReduceOptions{DType: wire.DTypeInt32, Compress: wire.DTypeFP16}, false},
		{AllReduceOptions{DType: wire.DTypeFloat32, Compress: wire.DTypeFloat32}, false},
	} {
		if err := tc.o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: got %v, want ok=%v", tc.o, err, tc.ok)
		}
	}
	// RunAllReduce refuses before any collective, so no peer is needed.
	comms := ringtest.MemComms(t, 1, nil)
	o := AllReduceOptions{Sizes: []int64{8}, DType: wire.DTypeFloat64, Op: wire.OpSum, Compress: wire.DTypeBF16}
	if _, err := RunAllReduce(context.Background(), comms[0], o); err == nil {
		t.Error("RunAllReduce accepted bf16 compression of float64")
	}
}
