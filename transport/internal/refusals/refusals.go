// Package refusals keeps the recent authentication refusals of a
// transport, for transport.RefusalReporter.
package refusals

import (
	"fmt"
	"sync"
	"time"

	"github.com/gyre-ml/gyre/transport"
)

// keep is how many refusals a Log remembers: enough to name every peer of
// a misconfigured job, bounded against a flood of intruders.
const keep = 64

// Log is a bounded record of refusals, safe for concurrent use. The zero
// Log is ready.
type Log struct {
	mu    sync.Mutex
	list  []transport.Refusal
	total uint64
}

// Add records a refusal of the connection from remote, whose certificate
// claimed the name claimed, for reason err.
func (l *Log) Add(remote, claimed string, err error) {
	r := transport.Refusal{Remote: remote, Claimed: transport.PeerID(claimed), At: time.Now(),
		Err: fmt.Errorf("%w: %v", transport.ErrUnauthenticated, err)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total++
	if len(l.list) == keep {
		copy(l.list, l.list[1:])
		l.list = l.list[:keep-1]
	}
	l.list = append(l.list, r)
}

// List returns the refusals, oldest first.
func (l *Log) List() []transport.Refusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]transport.Refusal(nil), l.list...)
}

// Total returns how many refusals were ever added, the forgotten too.
func (l *Log) Total() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}
