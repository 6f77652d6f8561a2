package obs

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/gyre-ml/gyre/internal/ownfile"
	"github.com/gyre-ml/gyre/ring"
)

// Trace is an Observer that writes Chrome trace-event JSON, the format
// Perfetto and chrome://tracing open: one process per worker (its pid the
// worker's first rank), with the trainer's spans and the boundaries on one
// thread, the collectives on another, and instant events for view
// changes, share changes and recoveries. Timestamps are microseconds of
// the worker's wall clock since the Unix epoch, so that files from
// several workers line up once their clock offsets are applied.
//
// Events are written as they end, one per line, and reach the file at
// every boundary, so a killed worker's file holds all but its last
// iteration and ReadTrace reads it. Close writes the closing bracket.
// Each event costs a small allocation and a write under a lock, on the
// goroutine that reports it: unlike Metrics, a Trace is not free on the
// collective's path.
type Trace struct {
	mu     sync.Mutex
	f      *os.File
	w      *bufio.Writer
	pid    int // -1 until Start
	skew   time.Duration
	held   []traceEvent // events before Start
	events int
	closed bool // events after Close (a leaving worker's last boundary) are dropped
	err    error
}

// Threads of a worker's trace.
const (
	traceThreadTrainer    = 1
	traceThreadCollective = 2
	traceThreadBuckets    = 3
)

// traceEvent is one Chrome trace event.
type traceEvent struct {
	Name  string         `json:"name"`
	Cat   string         `json:"cat,omitempty"`
	Ph    string         `json:"ph"`
	Ts    float64        `json:"ts"`
	Dur   float64        `json:"dur,omitempty"`
	Pid   int            `json:"pid"`
	Tid   int            `json:"tid"`
	Scope string         `json:"s,omitempty"`
	Args  map[string]any `json:"args,omitempty"`
}

// NewTrace creates path for a worker's trace. Events before Start, while
// the worker joins and its rank is not known, are held until then. skew
// is added to every timestamp: zero but in tests of Merge.
func NewTrace(path string, skew time.Duration) (*Trace, error) {
	f, err := ownfile.Create(path)
	if err != nil {
		return nil, fmt.Errorf("obs: timeline: %w", err)
	}
	t := &Trace{f: f, w: bufio.NewWriter(f), pid: -1, skew: skew}
	if _, err := t.w.WriteString("[\n"); err != nil {
		f.Close()
		return nil, fmt.Errorf("obs: timeline: %w", err)
	}
	return t, nil
}

// Start names the worker's process in the trace: pid, its rank when it
// joined, and name. It writes the events held so far.
func (t *Trace) Start(pid int, name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.start(pid, name)
}

func (t *Trace) start(pid int, name string) {
	t.pid = pid
	t.write(traceEvent{Name: "process_name", Ph: "M", Pid: pid, Args: map[string]any{"name": fmt.Sprintf("rank %d (%s)", pid, name)}})
	t.write(traceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: traceThreadTrainer, Args: map[string]any{"name": "trainer"}})
	t.write(traceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: traceThreadCollective, Args: map[string]any{"name": "collectives"}})
	t.write(traceEvent{Name: "thread_name", Ph: "M", Pid: pid, Tid: traceThreadBuckets, Args: map[string]any{"name": "gradient buckets"}})
	for _, e := range t.held {
		e.Pid = pid
		t.write(e)
	}
	t.held = nil
}

func (t *Trace) micros(at time.Time) float64 { return float64(at.Add(t.skew).UnixNano()) / 1e3 }

// write appends one event; the caller holds mu or owns t.
func (t *Trace) write(e traceEvent) {
	if t.err != nil {
		return
	}
	b, err := json.Marshal(e)
	if err != nil {
		t.err = err
		return
	}
	if t.events > 0 {
		t.w.WriteString(",\n")
	}
	t.events++
	_, t.err = t.w.Write(b)
}

func (t *Trace) add(e traceEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	if t.pid < 0 {
		t.held = append(t.held, e)
		return
	}
	e.Pid = t.pid
	t.write(e)
}

// span records a complete event from start to end.
func (t *Trace) span(name, cat string, tid int, start, end time.Time, args map[string]any) {
	t.add(traceEvent{Name: name, Cat: cat, Ph: "X", Ts: t.micros(start), Dur: float64(end.Sub(start).Nanoseconds()) / 1e3, Tid: tid, Args: args})
}

// Collective records a collective as a span on the collectives thread.
func (t *Trace) Collective(s ring.CollectiveStats) {
	end := time.Now()
	args := map[string]any{"algorithm": s.Algo.String(), "bytes": s.Bytes}
	if s.Err != nil {
		args["error"] = s.Err.Error()
	}
	t.span(s.Algo.Op(), "collective", traceThreadCollective, end.Add(-s.Duration), end, args)
}

// Boundary records the boundary as a span on the trainer's thread, and
// its view change, share change or recovery as instant events.
func (t *Trace) Boundary(b Boundary) {
	end := time.Now()
	args := map[string]any{"iter": b.Iter, "next": b.Next, "epoch": b.Epoch}
	if b.Err != nil {
		args["error"] = b.Err.Error()
	}
	t.span("boundary", "boundary", traceThreadTrainer, end.Add(-b.Duration), end, args)
	instant := func(name string, args map[string]any) {
		t.add(traceEvent{Name: name, Cat: "view", Ph: "i", Scope: "p", Ts: t.micros(end), Tid: traceThreadTrainer, Args: args})
	}
	switch {
	case b.Err != nil:
	case b.Redo:
		instant("recovery", map[string]any{"epoch": b.Epoch, "members": b.Members, "redo_from": b.Next})
	case b.ViewChanged:
		instant("view change", map[string]any{"epoch": b.Epoch, "members": b.Members})
	case b.SharesChanged:
		instant("shares", map[string]any{"shares": append([]int(nil), b.Shares...)})
	}
	// Each boundary reaches the file, so a killed worker's timeline lacks
	// at most its last iteration.
	t.Flush()
}

// Bucket records a gradient bucket on the buckets thread: a span from the
// start of its turn to its end, named for its tensors, holding its
// phases (pack, allreduce, unpack); how long it queued behind earlier
// buckets is an argument, since queued buckets overlap the one running.
func (t *Trace) Bucket(b ring.BucketStats) {
	args := map[string]any{"tensors": append([]string(nil), b.Tensors...), "bytes": b.Bytes,
		"queued_us": float64(b.Started.Sub(b.Closed).Nanoseconds()) / 1e3}
	if b.Err != nil {
		args["error"] = b.Err.Error()
	}
	t.span(bucketName(b.Tensors), "bucket", traceThreadBuckets, b.Started, b.Done, args)
	t.span("pack", "bucket", traceThreadBuckets, b.Started, b.Packed, nil)
	t.span("allreduce", "bucket", traceThreadBuckets, b.Packed, b.Reduced, nil)
	if !b.Done.Equal(b.Reduced) {
		t.span("unpack", "bucket", traceThreadBuckets, b.Reduced, b.Done, nil)
	}
}

// bucketName names a bucket for its first and last tensors.
func bucketName(tensors []string) string {
	switch len(tensors) {
	case 0:
		return "bucket"
	case 1:
		return "bucket " + tensors[0]
	}
	return fmt.Sprintf("bucket %s … %s (%d)", tensors[0], tensors[len(tensors)-1], len(tensors))
}

// Stall records a stall report as an instant event on the trainer's
// thread, and flushes, so the file shows it while the job is stuck.
func (t *Trace) Stall(s Stall) {
	t.add(traceEvent{Name: "stall", Cat: "stall", Ph: "i", Scope: "p", Ts: t.micros(time.Now()), Tid: traceThreadTrainer,
		Args: map[string]any{"collective": s.Collective, "step": s.Step, "op": s.Op, "iter": s.Iter, "begun": s.Begun,
			"waited_s": s.Waited.Seconds(), "behind": s.Behind, "pending": s.Pending}})
	t.Flush()
}

// Span records a trainer-side phase (forward, backward, step, eval).
func (t *Trace) Span(kind string, iter int64, start, end time.Time) {
	t.span(kind, "trainer", traceThreadTrainer, start, end, map[string]any{"iter": iter})
}

// Flush writes what is buffered, so the file holds every event so far.
func (t *Trace) Flush() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.err == nil && !t.closed {
		t.err = t.w.Flush()
	}
	return t.err
}

// Close ends the JSON array and closes the file. Events held for a Start
// that never came are written under pid 0.
func (t *Trace) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return t.err
	}
	t.closed = true
	if t.pid < 0 {
		t.start(0, "not joined")
	}
	if t.err == nil {
		_, t.err = t.w.WriteString("\n]\n")
	}
	if t.err == nil {
		t.err = t.w.Flush()
	}
	if err := t.f.Close(); t.err == nil {
		t.err = err
	}
	return t.err
}
