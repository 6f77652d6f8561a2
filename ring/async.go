package ring

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
)

// DefaultBucketBytes is FuserConfig.BucketBytes's default, DDP's 25 MiB.
const DefaultBucketBytes = 25 << 20

// FuserConfig configures a Fuser. Every rank of the Comm must use the same
// BucketBytes, Op and Compress, so that all build identical buckets and
// run identical collectives.
type FuserConfig struct {
	// BucketBytes is the size at which the open bucket is closed and sent.
	// Default 25 MiB.
	BucketBytes int
	// Op is the reduction. Default wire.OpSum; Min, Max and Avg are also
	// allowed.
	Op wire.Op
	// Compress is the wire compression of every bucket's allreduce:
	// wire.DTypeBF16 or wire.DTypeFP16 (see Comm.AllReduceCompressed), for
	// a Fuser[float32] only. The zero value, wire.DTypeBytes, means none.
	Compress wire.DType
	// AutoCompress, with Compress none, chooses each bucket's compression
	// by its size from the Comm's cost model: bf16 or none
	// (Comm.AutoCompression). For a Fuser[float32] only.
	AutoCompress bool
	// Observer, if set, is told of every bucket when it ends, with its
	// tensors' names and the times of its phases.
	Observer BucketObserver
}

// Validate checks the configuration.
func (cfg *FuserConfig) Validate() error {
	if cfg.BucketBytes < 0 {
		return invalid("bucket size %d bytes < 0", cfg.BucketBytes)
	}
	switch cfg.Op {
	case wire.OpNone, wire.OpSum, wire.OpMin, wire.OpMax, wire.OpAvg:
	default:
		return invalid("unknown op %v", cfg.Op)
	}
	if cfg.AutoCompress && cfg.Compress != wire.DTypeBytes {
		return invalid("automatic compression and %v compression at once", cfg.Compress)
	}
	_, err := codecOf(cfg.Compress)
	return err
}

// Fuser fuses float32 or float64 tensors submitted in order into buckets
// and allreduces each bucket on a Comm, overlapping communication with the
// computation that produces later tensors, as PyTorch DDP does.
//
// Buckets. Bucket boundaries depend only on the order and byte sizes of the
// submitted tensors, never on timers, so every rank that submits the same
// sequence builds identical buckets. A tensor is appended to the open
// bucket, which is closed and sent once it holds BucketBytes or more; a
// tensor larger than BucketBytes first closes the open bucket, if not
// empty, and then gets a bucket of its own. Flush closes the open bucket
// whatever its size.
//
// Execution. One background goroutine runs the closed buckets in order,
// one collective at a time: it copies the bucket's tensors into a reusable
// contiguous buffer, allreduces it with Op (compressed on the wire if
// Compress says so), copies the result back and completes the bucket's
// handles. The Comm must not run other collectives meanwhile, since every
// rank must issue its collectives in the same order.
//
// Failure. When a bucket's collective fails, its handles and those of every
// later bucket fail with that error: the Comm then needs rebuilding (see
// Comm), and so does the Fuser.
//
// Concurrency. AllReduceAsync and Flush are meant to be called from one
// goroutine, the trainer's backward pass, since their order defines the
// buckets; they never block on the network. Handle.Wait is safe from any
// goroutine. Close is safe from any goroutine.
type Fuser[T float32 | float64] struct {
	c   *Comm
	cfg FuserConfig
	es  int // element size in bytes

	mu      sync.Mutex
	open    *bucket[T]
	queue   []*bucket[T] // closed, not yet started
	free    []*bucket[T] // done, for reuse
	err     error        // the first failure; fails every later bucket
	closed  bool
	wake    chan struct{} // capacity 1: the queue grew or Close ran
	life    context.Context
	stop    context.CancelFunc
	wg      sync.WaitGroup
	running *bucket[T]   // the bucket whose collective is under way
	buf     []T          // the worker's contiguous buffer, reused
	buckets atomic.Int64 // buckets closed, for tests and metrics
}

// bucket is a run of tensors reduced by one collective. Its slices are
// reused once its handles complete.
type bucket[T float32 | float64] struct {
	ctx     context.Context // the context of the call that closed it
	tensors [][]T
	names   []string // the tensors' names, for stall reports and timelines
	handles []*Handle
	elems   int
	closed  time.Time
}

// Handle is the pending result of one AllReduceAsync.
type Handle struct {
	done chan struct{}
	err  error
}

// Wait blocks until the tensor holds the reduced result, or its bucket's
// collective failed, and returns that collective's error. If ctx ends first
// it returns ctx.Err(); only the wait ends, the bucket still runs. Wait is
// safe for concurrent use and may be called more than once.
func (h *Handle) Wait(ctx context.Context) error {
	select {
	case <-h.done:
		return h.err
	default:
	}
	select {
	case <-h.done:
		return h.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (h *Handle) complete(err error) {
	h.err = err
	close(h.done)
}

// NewFuser returns a Fuser over c, which the caller keeps owning. It starts
// one goroutine, which Close stops.
func NewFuser[T float32 | float64](c *Comm, cfg FuserConfig) (*Fuser[T], error) {
	if c == nil {
		return nil, invalid("nil comm")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.BucketBytes == 0 {
		cfg.BucketBytes = DefaultBucketBytes
	}
	if cfg.Op == wire.OpNone {
		cfg.Op = wire.OpSum
	}
	var z T
	if (cfg.Compress != wire.DTypeBytes || cfg.AutoCompress) && wireDType[T]() != wire.DTypeFloat32 {
		return nil, invalid("compression of %v buckets", wireDType[T]())
	}
	f := &Fuser[T]{c: c, cfg: cfg, es: int(unsafe.Sizeof(z)), wake: make(chan struct{}, 1)}
	f.life, f.stop = context.WithCancel(context.Background())
	f.wg.Add(1)
	go f.run()
	return f, nil
}

// AllReduceAsync appends t, the tensor called name, to the open bucket and
// returns a handle to its result, closing the bucket if it is now full (see
// Fuser). The name is for people: stall reports and timelines list the
// names of a bucket's tensors. The caller must
// not touch t until the handle's Wait returns nil or an error other than
// ctx's. ctx bounds the collective of the bucket this call closes, if any.
// After Close, or after a failure, the handle fails at once.
func (f *Fuser[T]) AllReduceAsync(ctx context.Context, name string, t []T) *Handle {
	h := &Handle{done: make(chan struct{})}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.closed:
		h.complete(ErrClosed)
		return h
	case f.err != nil:
		h.complete(f.err)
		return h
	}
	size := len(t) * f.es
	if size > f.cfg.BucketBytes && f.open != nil {
		f.closeLocked(ctx)
	}
	if f.open == nil {
		f.open = f.newBucketLocked()
	}
	b := f.open
	b.tensors = append(b.tensors, t)
	b.names = append(b.names, name)
	b.handles = append(b.handles, h)
	b.elems += len(t)
	if b.elems*f.es >= f.cfg.BucketBytes {
		f.closeLocked(ctx)
	}
	return h
}

// Flush closes the open bucket, even if small, so that it is sent. ctx
// bounds its collective. It does not wait.
func (f *Fuser[T]) Flush(ctx context.Context) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.open != nil && !f.closed {
		f.closeLocked(ctx)
	}
}

// Close fails the handles of every bucket not yet done, including the open
// one, with ErrClosed, cancelling the collective in progress (the Comm then
// needs rebuilding), and stops the goroutine. A trainer waits for its
// handles before closing. Close is idempotent; it does not close the Comm.
func (f *Fuser[T]) Close() error {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		return nil
	}
	f.closed = true
	pending := f.queue
	f.queue = nil
	if f.open != nil {
		pending = append(pending, f.open)
		f.open = nil
	}
	f.mu.Unlock()
	for _, b := range pending {
		for _, h := range b.handles {
			h.complete(ErrClosed)
		}
	}
	f.stop()
	f.signal()
	f.wg.Wait()
	return nil
}

// Pending returns the names of the tensors submitted and not yet reduced,
// in submission order: those of the bucket under way, the queued buckets
// and the open one. A stall report lists them.
func (f *Fuser[T]) Pending() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	if f.running != nil {
		names = append(names, f.running.names...)
	}
	for _, b := range f.queue {
		names = append(names, b.names...)
	}
	if f.open != nil {
		names = append(names, f.open.names...)
	}
	return names
}

func (f *Fuser[T]) newBucketLocked() *bucket[T] {
	if n := len(f.free); n > 0 {
		b := f.free[n-1]
		f.free = f.free[:n-1]
		return b
	}
	return &bucket[T]{}
}

// closeLocked queues the open bucket for the worker.
func (f *Fuser[T]) closeLocked(ctx context.Context) {
	f.open.ctx, f.open.closed = ctx, time.Now()
	f.queue = append(f.queue, f.open)
	f.open = nil
	f.buckets.Add(1)
	f.signal()
}

func (f *Fuser[T]) signal() {
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

// run executes the queued buckets in order until Close.
func (f *Fuser[T]) run() {
	defer f.wg.Done()
	for {
		f.mu.Lock()
		if f.closed {
			f.mu.Unlock()
			return
		}
		if len(f.queue) == 0 {
			f.mu.Unlock()
			<-f.wake
			continue
		}
		b := f.queue[0]
		f.queue[0] = nil
		f.queue = f.queue[1:]
		f.running = b
		err := f.err
		f.mu.Unlock()

		if err == nil {
			err = f.reduce(b)
		}
		f.mu.Lock()
		if err != nil && f.err == nil {
			f.err = err
		}
		f.running = nil
		f.mu.Unlock()
		for _, h := range b.handles {
			h.complete(err)
		}
		f.recycle(b)
	}
}

// reduce runs b's collective through the reusable buffer.
func (f *Fuser[T]) reduce(b *bucket[T]) error {
	if b.elems == 0 {
		return nil
	}
	var st BucketStats
	if f.cfg.Observer != nil {
		st = BucketStats{Tensors: b.names, Bytes: b.elems * f.es, Closed: b.closed, Started: time.Now()}
		defer func() {
			if st.Done = time.Now(); st.Err != nil {
				st.Done = st.Reduced // nothing was copied back
			}
			f.cfg.Observer.Bucket(st)
		}()
	}
	if cap(f.buf) < b.elems {
		f.buf = make([]T, b.elems)
	}
	buf := f.buf[:b.elems]
	off := 0
	for _, t := range b.tensors {
		off += copy(buf[off:], t)
	}
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	defer context.AfterFunc(f.life, cancel)()
	wt := f.cfg.Compress
	if f.cfg.AutoCompress {
		wt = f.c.AutoCompression(len(buf) * f.es)
	}
	if f.cfg.Observer != nil {
		st.Packed = time.Now()
	}
	err := f.c.AllReduceCompressed(ctx, wireDType[T](), f.cfg.Op, kernels.Bytes(buf), wt)
	if f.cfg.Observer != nil {
		st.Reduced, st.Err = time.Now(), err
	}
	if err != nil {
		return err
	}
	off = 0
	for _, t := range b.tensors {
		off += copy(t, buf[off:])
	}
	return nil
}

// recycle clears b and keeps it for a later bucket.
func (f *Fuser[T]) recycle(b *bucket[T]) {
	clear(b.tensors)
	clear(b.names)
	clear(b.handles)
	b.tensors, b.names, b.handles, b.elems, b.ctx = b.tensors[:0], b.names[:0], b.handles[:0], 0, nil
	f.mu.Lock()
	f.free = append(f.free, b)
	f.mu.Unlock()
}
