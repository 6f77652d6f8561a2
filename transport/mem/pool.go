package mem

import (
	"math/bits"
	"sync"
)

// Size classes of pooled payload buffers: powers of two from 64 B to
// 256 MiB. Larger payloads are allocated and left to the collector.
const (
	minClass = 6
	maxClass = 28
	// maxPooled bounds the bytes a Network keeps for reuse, so a burst of
	// queued messages does not pin its memory for the rest of the test.
	maxPooled = 256 << 20
)

// pool recycles payload buffers by size class, so that steady-state traffic
// allocates nothing. It is a plain free list rather than a sync.Pool: under
// the race detector sync.Pool drops a share of what it is given on purpose,
// which would make the zero-allocation test fail under -race.
type pool struct {
	mu    sync.Mutex
	free  [maxClass + 1][]*[]byte
	bytes int
}

func sizeClass(n int) int {
	return max(bits.Len(uint(n-1)), minClass)
}

// get returns a buffer of length n > 0.
func (p *pool) get(n int) *[]byte {
	c := sizeClass(n)
	if c <= maxClass {
		p.mu.Lock()
		if l := p.free[c]; len(l) > 0 {
			b := l[len(l)-1]
			l[len(l)-1] = nil
			p.free[c] = l[:len(l)-1]
			p.bytes -= cap(*b)
			p.mu.Unlock()
			*b = (*b)[:n]
			return b
		}
		p.mu.Unlock()
		b := make([]byte, n, 1<<c)
		return &b
	}
	b := make([]byte, n)
	return &b
}

// put takes back a buffer from get; nil is ignored.
func (p *pool) put(b *[]byte) {
	if b == nil {
		return
	}
	size := cap(*b)
	c := sizeClass(size)
	if c > maxClass || size != 1<<c {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.bytes+size > maxPooled {
		return
	}
	p.free[c] = append(p.free[c], b)
	p.bytes += size
}
