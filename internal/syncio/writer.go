// Package syncio has the io helpers that several goroutines share.
package syncio

import (
	"io"
	"sync"
)

// Writer passes each Write on to the writer it wraps whole, one at a time:
// several goroutines (each copying a child process's output, say) can
// share it without interleaving or racing on the writer underneath.
type Writer struct {
	mu sync.Mutex
	w  io.Writer
}

// NewWriter returns a Writer that serialises writes to w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

func (l *Writer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
