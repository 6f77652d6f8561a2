package checkpoint

import (
	"io"
	"sync"
	"time"
)

// Writer writes snapshots into a directory beside training, one at a
// time: the snapshot handed to Start is the writer's until the write
// ends, and a checkpoint that falls due meanwhile waits for it (Busy), so
// that a slow disk delays checkpoints, never the caller.
type Writer struct {
	dir  Dir
	keep int
	done func(Result)

	mu   sync.Mutex
	busy bool
	wg   sync.WaitGroup
}

// Result is what one write did.
type Result struct {
	Name string        // the checkpoint's file name
	Took time.Duration // from Start to the end of the write
	Err  error         // why it failed, nil if it is on disk
	// PruneErr is a failure to remove the checkpoints beyond keep, after
	// a write that succeeded.
	PruneErr error
}

// NewWriter returns a Writer into dir that keeps the newest keep
// checkpoints (keep < 1: all) and reports each write to done, from its
// own goroutine, before Busy reports the writer free.
func NewWriter(dir Dir, keep int, done func(Result)) *Writer {
	return &Writer{dir: dir, keep: keep, done: done}
}

// Busy reports whether a write is under way.
func (w *Writer) Busy() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.busy
}

// Start writes s in the background and reports true, or reports false if
// a write is under way. The caller must not touch s until Busy is false.
// wrap, if not nil, wraps the file the bytes go to (a test's failpoint).
func (w *Writer) Start(s *Snapshot, wrap func(io.Writer) io.Writer) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.busy {
		return false
	}
	w.busy = true
	w.wg.Add(1)
	go w.write(s, wrap, time.Now())
	return true
}

func (w *Writer) write(s *Snapshot, wrap func(io.Writer) io.Writer, start time.Time) {
	defer w.wg.Done()
	name, err := w.dir.write(s, wrap)
	res := Result{Name: name, Err: err, Took: time.Since(start)}
	if err == nil {
		res.PruneErr = w.dir.Prune(w.keep)
	}
	if w.done != nil {
		w.done(res) // before Busy turns false: whoever sees it false has the result
	}
	w.mu.Lock()
	w.busy = false
	w.mu.Unlock()
}

// Wait waits until no write is under way.
func (w *Writer) Wait() { w.wg.Wait() }
