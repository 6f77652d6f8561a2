package mem

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// session is a connection between two transports, end[0] (which dialled)
// and end[1]: one ordered queue per direction and channel.
type session struct {
	end [2]*Transport

	mu sync.Mutex
	// sendErr[i], once set, is why end[i] can no longer send.
	sendErr [2]error
	// q[i][ch] holds the messages on ch to end[i].
	q [2][transport.NumChannels]queue
}

// queue is a FIFO of messages with one reader. Delivery follows the FIFO
// order; a message's delivery time only gates it while it is at the head,
// so delays never reorder a stream.
type queue struct {
	msgs []msg // ring buffer; grows, never shrinks, so steady state allocates nothing
	head int
	n    int
	// err, once set, is returned by Recv when the queue is empty.
	err error
	// ready wakes the reader. It has room for one token, so a sender never
	// blocks on it and a wake-up between the reader's check and its wait is
	// not lost.
	ready chan struct{}
	// timer wakes the reader when a delayed head becomes deliverable. Only
	// the reader uses it, and it is reused across messages.
	timer *time.Timer
}

type msg struct {
	hdr wire.Header
	buf *[]byte   // pooled copy of the payload; nil when empty
	at  time.Time // earliest delivery; zero means at once
}

func newSession(a, b *Transport) *session {
	s := &session{end: [2]*Transport{a, b}}
	for i := range s.q {
		for ch := range s.q[i] {
			s.q[i][ch].ready = make(chan struct{}, 1)
		}
	}
	return s
}

func (s *session) healthy() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sendErr[0] == nil && s.sendErr[1] == nil
}

// send queues a copy of payload for the other end. The copy is made before
// taking the lock, so large messages on one session do not stall the other
// direction.
func (s *session) send(n *Network, side int, ch transport.Channel, hdr wire.Header, payload []byte) error {
	to := s.end[1-side]
	lost, delay := n.fate(stream{s.end[side].id, to.id, ch}, len(payload))
	var b *[]byte
	if !lost && len(payload) > 0 {
		b = n.pool.get(len(payload))
		copy(*b, payload)
	}
	var at time.Time
	if delay > 0 {
		at = time.Now().Add(delay)
	}
	s.mu.Lock()
	if err := s.sendErr[side]; err != nil {
		s.mu.Unlock()
		n.pool.put(b)
		return &transport.PeerError{Peer: to.id, Op: "send", Err: err}
	}
	if lost {
		s.mu.Unlock()
		return nil
	}
	q := &s.q[1-side][ch]
	q.push(msg{hdr: hdr, buf: b, at: at})
	s.mu.Unlock()
	q.wake()
	return nil
}

// recv takes the next message on ch for end side, waiting for it.
func (s *session) recv(ctx context.Context, t *Transport, side int, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	q := &s.q[side][ch]
	from := s.end[1-side].id
	for {
		if err := t.waitThawed(ctx); err != nil {
			return wire.Header{}, 0, err
		}
		var timer <-chan time.Time
		s.mu.Lock()
		if q.n > 0 {
			m := &q.msgs[q.head]
			var wait time.Duration
			if !m.at.IsZero() {
				wait = time.Until(m.at)
			}
			if wait <= 0 {
				m := q.pop()
				s.mu.Unlock()
				return deliver(&t.net.pool, m, buf)
			}
			if q.timer == nil {
				q.timer = time.NewTimer(wait)
			} else {
				q.timer.Reset(wait)
			}
			timer = q.timer.C
		} else if q.err != nil {
			err := q.err
			s.mu.Unlock()
			if t.isClosed() {
				return wire.Header{}, 0, transport.ErrClosed
			}
			return wire.Header{}, 0, &transport.PeerError{Peer: from, Op: "recv", Err: err}
		}
		s.mu.Unlock()
		select {
		case <-q.ready:
		case <-timer:
		case <-ctx.Done():
			return wire.Header{}, 0, ctx.Err()
		case <-t.done:
			return wire.Header{}, 0, transport.ErrClosed
		}
	}
}

// deliver copies m into buf and recycles its buffer.
func deliver(p *pool, m msg, buf []byte) (wire.Header, int, error) {
	defer p.put(m.buf)
	n := int(m.hdr.Len)
	if n > len(buf) {
		return m.hdr, 0, fmt.Errorf("mem: %w: %d bytes into %d", wire.ErrShortBuffer, n, len(buf))
	}
	if n > 0 {
		copy(buf, (*m.buf)[:n])
	}
	return m.hdr, n, nil
}

// fail ends the session. causes[i] is the error end[i] sees from now on.
// Messages queued to end[i] are kept for it to read first if keep[i], and
// are discarded otherwise. The first failure's causes stick.
func (s *session) fail(causes [2]error, keep [2]bool, p *pool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range s.q {
		if s.sendErr[i] == nil {
			s.sendErr[i] = causes[i]
		}
		for ch := range s.q[i] {
			q := &s.q[i][ch]
			if q.err == nil {
				q.err = causes[i]
			}
			if !keep[i] {
				q.clear(p)
			}
			q.wake()
		}
	}
}

func (q *queue) push(m msg) {
	if q.n == len(q.msgs) {
		grown := make([]msg, max(8, 2*len(q.msgs)))
		for i := range q.n {
			grown[i] = q.msgs[(q.head+i)%len(q.msgs)]
		}
		q.msgs, q.head = grown, 0
	}
	q.msgs[(q.head+q.n)%len(q.msgs)] = m
	q.n++
}

func (q *queue) pop() msg {
	m := q.msgs[q.head]
	q.msgs[q.head] = msg{}
	q.head = (q.head + 1) % len(q.msgs)
	q.n--
	return m
}

func (q *queue) clear(p *pool) {
	for q.n > 0 {
		p.put(q.pop().buf)
	}
}

func (q *queue) wake() {
	select {
	case q.ready <- struct{}{}:
	default:
	}
}
