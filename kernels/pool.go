package kernels

import (
	"runtime"
	"sync"
)

// ParallelThreshold is the size of dst, in bytes, from which a Pool splits a
// call across its cores. Below it, handing a range to another goroutine
// (a channel send and a wake-up, a few microseconds) costs more than the
// range takes to reduce.
const ParallelThreshold = 256 << 10

// DefaultWorker is the function name that the default pool's goroutines
// run, for leak checks in tests that use package-level calls:
// goleak.IgnoreAnyFunction(kernels.DefaultWorker). Those goroutines start
// on the first large call and live as long as the process.
const DefaultWorker = "github.com/gyre-ml/gyre/kernels.defaultWorker"

// A Pool splits large kernel calls across cores. It keeps procs-1
// persistent worker goroutines fed with value-type jobs over a channel; the
// calling goroutine reduces the first range itself and waits for the
// others. A call on a warm pool allocates nothing.
//
// Calls below ParallelThreshold run entirely on the calling goroutine, as
// do all calls on a nil *Pool, on a pool of one proc, and on a closed pool.
// Every split is at element boundaries and each element is computed exactly
// as the serial loop computes it, so results are bitwise identical whether
// a call is split or not.
//
// A Pool is safe for concurrent use. The buffers of one call must not
// overlap unless they are identical.
type Pool struct {
	procs     int // ranges a large call is cut into: workers + the caller
	minBytes  int // ParallelThreshold; tests lower it
	isDefault bool
	jobs      chan job
	free      chan chan struct{} // completion channels, reused across calls

	mu     sync.RWMutex // held for reading by each split call, for writing by Close
	closed bool
	wg     sync.WaitGroup
}

// NewPool starts a pool that splits large calls into procs ranges, using
// procs-1 worker goroutines besides the caller. procs <= 0 means
// runtime.GOMAXPROCS(0). Close stops the workers.
func NewPool(procs int) *Pool { return newPool(procs, false) }

func newPool(procs int, isDefault bool) *Pool {
	if procs <= 0 {
		procs = runtime.GOMAXPROCS(0)
	}
	p := &Pool{
		procs:     procs,
		minBytes:  ParallelThreshold,
		isDefault: isDefault,
		jobs:      make(chan job, 4*procs),
		free:      make(chan chan struct{}, 16),
	}
	for range procs - 1 {
		p.wg.Add(1)
		if isDefault {
			go defaultWorker(p)
		} else {
			go p.work()
		}
	}
	return p
}

var defaultPool struct {
	once sync.Once
	p    *Pool
}

// Default returns the pool behind the package-level functions. It is
// started on first use with runtime.GOMAXPROCS(0) procs and is never
// stopped; Close on it does nothing.
func Default() *Pool {
	defaultPool.once.Do(func() { defaultPool.p = newPool(0, true) })
	return defaultPool.p
}

// Procs returns how many ranges a large call is split into (1 for a nil
// pool).
func (p *Pool) Procs() int {
	if p == nil {
		return 1
	}
	return p.procs
}

// Close stops the pool's workers and waits for them to exit, after letting
// calls in progress finish. Later calls on the pool run serially. Close is
// idempotent, and does nothing on a nil pool or on Default().
func (p *Pool) Close() {
	if p == nil || p.isDefault {
		return
	}
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.jobs)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// defaultWorker is the default pool's worker, a separate function so that
// leak checks can name it (DefaultWorker).
//
//go:noinline
func defaultWorker(p *Pool) { p.work() }

func (p *Pool) work() {
	defer p.wg.Done()
	for j := range p.jobs {
		run(&j)
		j.done <- struct{}{}
	}
}

// cacheLine is the granularity of the split, so that two goroutines never
// write the same cache line.
const cacheLine = 64

// exec runs j, split across the pool when it is large enough.
func (p *Pool) exec(j job) {
	ds, _ := j.sizes()
	if p == nil || p.procs < 2 || j.n == 0 || j.n*int(ds) < p.minBytes {
		run(&j)
		return
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		run(&j)
		return
	}
	// Ranges of equal size, rounded up to whole cache lines of dst.
	line := cacheLine / int(ds)
	chunk := (j.n + p.procs - 1) / p.procs
	chunk = (chunk + line - 1) / line * line
	parts := (j.n + chunk - 1) / chunk

	var done chan struct{}
	select {
	case done = <-p.free:
	default:
		done = make(chan struct{}, p.procs)
	}
	for i := 1; i < parts; i++ {
		part := j.part(i*chunk, min((i+1)*chunk, j.n))
		part.done = done
		p.jobs <- part
	}
	first := j.part(0, min(chunk, j.n))
	run(&first)
	for i := 1; i < parts; i++ {
		<-done
	}
	select {
	case p.free <- done:
	default:
	}
}
