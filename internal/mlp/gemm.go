package mlp

import (
	"runtime"
	"sync"
	"sync/atomic"

	"gonum.org/v1/gonum/blas"
	"gonum.org/v1/gonum/blas/blas64"
)

// gemmBlock is gonum's own block edge, and gemmMinBlocks the least number
// of output blocks for which gonum goes parallel (blas/gonum: blockSize,
// minParBlock). The tiled product below splits exactly as gonum does so
// that its sums run in gonum's order and its results are bit-identical
// whatever the number of goroutines.
const (
	gemmBlock     = 64
	gemmMinBlocks = 4
)

// gemm sets c = a·b + beta·c (a and b transposed as tA and tB say) on at
// most procs goroutines, the caller included; procs <= 0 leaves the split
// to gonum, which runs up to GOMAXPROCS goroutines.
//
// gonum sizes its worker limit from GOMAXPROCS alone, so a trainer that
// wants to leave a core to the transport cannot ask it for fewer: this
// runs gonum's own block schedule on a bounded set of goroutines instead.
// Each output block is a call small enough that gonum computes it
// serially, over the whole k in gemmBlock steps, as gonum's parallel path
// does.
func gemm(procs int, tA, tB blas.Transpose, a, b blas64.General, beta float64, c blas64.General) {
	m, n := c.Rows, c.Cols
	rowBlocks, colBlocks := ceilDiv(m, gemmBlock), ceilDiv(n, gemmBlock)
	if procs <= 0 || rowBlocks*colBlocks < gemmMinBlocks {
		// gonum's own path: parallel with GOMAXPROCS, or serial (as small
		// products are whatever the procs) for products below its cut.
		blas64.Gemm(tA, tB, 1, a, b, beta, c)
		return
	}
	k := a.Cols
	if tA == blas.Trans {
		k = a.Rows
	}
	scale(beta, c) // gonum scales c once, then accumulates with beta 1
	blocks := rowBlocks * colBlocks
	var next atomic.Int64
	work := func() {
		for {
			blk := int(next.Add(1) - 1)
			if blk >= blocks {
				return
			}
			i, j := blk/colBlocks*gemmBlock, blk%colBlocks*gemmBlock
			rows, cols := min(gemmBlock, m-i), min(gemmBlock, n-j)
			cSub := sub(c, i, j, rows, cols)
			for l := 0; l < k; l += gemmBlock {
				depth := min(gemmBlock, k-l)
				var aSub, bSub blas64.General
				if tA == blas.Trans {
					aSub = sub(a, l, i, depth, rows)
				} else {
					aSub = sub(a, i, l, rows, depth)
				}
				if tB == blas.Trans {
					bSub = sub(b, j, l, cols, depth)
				} else {
					bSub = sub(b, l, j, depth, cols)
				}
				blas64.Gemm(tA, tB, 1, aSub, bSub, 1, cSub)
			}
		}
	}
	helpers := min(procs, blocks) - 1
	var wg sync.WaitGroup
	wg.Add(helpers)
	for range helpers {
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

// scale sets c = beta·c, zeroing it for beta 0 (so NaNs in a fresh buffer
// never leak into the product), as gonum's Dgemm does before it sums.
func scale(beta float64, c blas64.General) {
	if beta == 1 {
		return
	}
	for r := range c.Rows {
		row := c.Data[r*c.Stride : r*c.Stride+c.Cols]
		if beta == 0 {
			clear(row)
			continue
		}
		for i := range row {
			row[i] *= beta
		}
	}
}

// sub is the rows×cols block of g whose top-left element is (i, j).
func sub(g blas64.General, i, j, rows, cols int) blas64.General {
	start := i*g.Stride + j
	return blas64.General{Rows: rows, Cols: cols, Stride: g.Stride, Data: g.Data[start : start+(rows-1)*g.Stride+cols]}
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// ComputeProcs is the number of goroutines a trainer's compute should use
// so that one of the process's GOMAXPROCS stays free for the transport:
// GOMAXPROCS−1, and never less than 1. With every P busy in matrix
// products, a goroutine that a packet wakes waits in the run queue for a
// block to finish, and quic-go, whose every packet passes through such
// goroutines, slows down most.
func ComputeProcs() int { return max(1, runtime.GOMAXPROCS(0)-1) }
