package kernels

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// ParallelThreshold is the size of dst, in bytes, from which a Pool splits a
// call across its cores. Below it the call runs on the caller alone: waking
// a worker costs microseconds, and a second core working on half of a
// buffer that sits in the first core's L2 pulls the lines across. Measured
// on this 2-core Xeon (2 MiB L2 per core, quiet machine), split against
// serial throughput crossed 1.0 between 2 and 4 MiB for every kernel: at
// 1 MiB float32 Sum ran at 0.89x, fp16 encode at 1.38x; at 2 MiB float64
// Sum still at 0.72x; at 4 MiB every kernel gained (1.18x to 1.55x), and at
// 16 MiB 1.57x to 2.2x. The ring reduces chunks of about 1 MiB serially and
// overlaps them with the network instead.
const ParallelThreshold = 4 << 20

// DefaultWorker is the function name that the default pool's goroutines
// run, for leak checks in tests that use package-level calls:
// goleak.IgnoreAnyFunction(kernels.DefaultWorker). Those goroutines start
// on the first large call and live as long as the process.
const DefaultWorker = "github.com/gyre-ml/gyre/kernels.defaultWorker"

// A Pool splits large kernel calls across cores. It keeps procs-1
// persistent worker goroutines; a large call is cut into ranges, the
// workers are woken over a channel, and the calling goroutine claims
// ranges too. Ranges are claimed one at a time from a shared counter, so a
// worker that is slow to be scheduled (the ring's network goroutines share
// the cores) simply gets fewer ranges and the caller never waits for a
// range nobody has started. A call on a warm pool allocates nothing: the
// per-call state is recycled through a free list.
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
	procs     int // goroutines that work on one large call: workers + the caller
	minBytes  int // ParallelThreshold; tests lower it
	minRange  int // minRangeBytes; tests lower it
	isDefault bool
	wake      chan *call // a large call, sent once to each worker asked to help
	free      chan *call // per-call state, reused

	mu     sync.RWMutex // held for reading by each split call, for writing by Close
	closed bool
	wg     sync.WaitGroup
}

// A call is the shared state of one split kernel call.
type call struct {
	j       job
	chunk   int           // elements per range; the last range may be shorter
	parts   int32         // ranges
	next    atomic.Int32  // next range to claim
	pending atomic.Int32  // ranges not yet finished
	refs    atomic.Int32  // goroutines that may still touch the call
	done    chan struct{} // receives one token when pending reaches 0
}

// help claims and runs ranges of c until none is left.
func (c *call) help() {
	for {
		i := c.next.Add(1) - 1
		if i >= c.parts {
			return
		}
		lo := int(i) * c.chunk
		part := c.j.part(lo, min(lo+c.chunk, c.j.n))
		run(&part)
		if c.pending.Add(-1) == 0 {
			c.done <- struct{}{}
		}
	}
}

// release drops one reference to c; the last one recycles it. A worker
// woken after the call finished still holds a reference, so c is never
// reused while anyone can touch it.
func (p *Pool) release(c *call) {
	if c.refs.Add(-1) == 0 {
		select {
		case p.free <- c:
		default:
		}
	}
}

// NewPool starts a pool that splits large calls over procs goroutines, the
// caller and procs-1 workers. procs <= 0 means runtime.GOMAXPROCS(0). Close
// stops the workers.
func NewPool(procs int) *Pool { return newPool(procs, false) }

func newPool(procs int, isDefault bool) *Pool {
	if procs <= 0 {
		procs = runtime.GOMAXPROCS(0)
	}
	p := &Pool{
		procs:     procs,
		minBytes:  ParallelThreshold,
		minRange:  minRangeBytes,
		isDefault: isDefault,
		wake:      make(chan *call, 4*procs),
		free:      make(chan *call, 16),
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

// Procs returns how many goroutines work on one large call (1 for a nil
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
		close(p.wake)
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
	for c := range p.wake {
		c.help()
		p.release(c)
	}
}

const (
	// cacheLine is the granularity of ranges, so that two goroutines
	// never write the same cache line.
	cacheLine = 64
	// rangesPerProc cuts a call finer than one range per goroutine, so
	// that the ranges balance when one goroutine runs late.
	rangesPerProc = 4
	// minRangeBytes bounds the cost of claiming a range (two atomic adds)
	// against the work in it.
	minRangeBytes = 16 << 10
)

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
	line := cacheLine / int(ds)
	chunk := (j.n + rangesPerProc*p.procs - 1) / (rangesPerProc * p.procs)
	chunk = max(chunk, p.minRange/int(ds))
	chunk = (chunk + line - 1) / line * line
	parts := (j.n + chunk - 1) / chunk
	if parts < 2 {
		run(&j)
		return
	}
	var c *call
	select {
	case c = <-p.free:
	default:
		c = &call{done: make(chan struct{}, 1)}
	}
	helpers := min(p.procs-1, parts-1)
	c.j, c.chunk, c.parts = j, chunk, int32(parts)
	c.next.Store(0)
	c.pending.Store(int32(parts))
	c.refs.Store(int32(helpers + 1))
	for range helpers {
		p.wake <- c
	}
	c.help()
	<-c.done
	p.release(c)
}
