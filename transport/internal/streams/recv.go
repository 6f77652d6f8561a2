package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// longAgo is a read deadline in the past: it makes a blocked Read return.
var longAgo = time.Unix(1, 0)

// inSlot is the receiving side of one (peer, channel). It holds a queue of
// stream generations: a generation is one set of stripe streams the peer
// opened with the same stripe count. When the peer reopens the channel (it
// restarted, or a cancelled Send forced new streams), the new generation
// queues behind the old one, whose remaining messages are read first.
type inSlot struct {
	t    *Transport
	peer transport.PeerID
	ch   transport.Channel

	// Guarded by t.mu.
	gens    []*inGen
	changed chan struct{} // closed and replaced whenever gens change
	cur     *inGen        // generation the Recv in progress reads
	cc      canceller     // sets a past deadline on cur when a Recv's ctx ends
	quit    chan struct{} // closed when the peer is forgotten: stops the readers
	// reopenedAt is Transport.reopens just after the slot's last Reopen.
	// Generations accepted before it belong to an exchange both sides
	// gave up on: when one ends or fails, even mid-message, Recv waits
	// for the peer's next generation instead of failing.
	reopenedAt uint64

	// Owned by the Recv in progress (at most one per slot).
	readers []*stripeReader // index s for stripe s > 0
	scratch []byte          // for discarding messages too long for buf
}

// inGen is one generation of a channel's inbound streams.
type inGen struct {
	accepted uint64      // Transport.reopens when its first stream was accepted
	k        int         // stripes, from the Hello
	streams  []*inStream // guarded by t.mu; nil until the stripe arrives
	err      error       // guarded by t.mu; set once the generation is dead
}

// inStream is one accepted stream. n counts the bytes read from it, so a
// cancelled Recv can tell whether it left the stream out of step.
type inStream struct {
	s      InStream
	r      *wire.Reader
	n      int64 // touched only by the goroutine reading the stream
	closed atomic.Bool
}

func (s *inStream) Read(p []byte) (int, error) {
	n, err := s.s.Read(p)
	s.n += int64(n)
	return n, err
}

func (s *inStream) Close() error {
	if s.closed.CompareAndSwap(false, true) {
		return s.s.Close()
	}
	return nil
}

// slotLocked returns the slot of (p, ch), creating it. t.mu must be held.
func (t *Transport) slotLocked(p *peer, ch transport.Channel) *inSlot {
	s := p.in[ch]
	if s == nil {
		s = &inSlot{t: t, peer: p.id, ch: ch, changed: make(chan struct{}), quit: make(chan struct{})}
		s.cc = canceller{mu: &t.mu, onCancel: s.cancelLocked}
		p.in[ch] = s
	}
	return s
}

// reopened reports whether g was accepted before the last Reopen of the
// slot's channel: the peer has left it, or is leaving it, for a new
// generation. t.mu must be held.
func (sl *inSlot) reopened(g *inGen) bool { return g.accepted < sl.reopenedAt }

func (sl *inSlot) signalLocked() {
	close(sl.changed)
	sl.changed = make(chan struct{})
}

// killLocked marks every live generation dead with err (adding a dead one
// if there is none, so later Recvs fail at once) and appends its streams
// to closers. t.mu must be held.
func (sl *inSlot) killLocked(err error, closers []io.Closer) []io.Closer {
	if len(sl.gens) == 0 {
		// Current, not left behind by a Reopen: a Recv reports it.
		sl.gens = append(sl.gens, &inGen{err: err, accepted: sl.t.reopens})
	}
	for _, g := range sl.gens {
		closers = g.killLocked(err, closers)
	}
	sl.signalLocked()
	return closers
}

func (g *inGen) killLocked(err error, closers []io.Closer) []io.Closer {
	if g.err != nil {
		return closers
	}
	g.err = err
	for _, s := range g.streams {
		if s != nil {
			closers = append(closers, s)
		}
	}
	return closers
}

// setDeadlineLocked sets the read deadline of every stream of g.
func (g *inGen) setDeadlineLocked(d time.Time) {
	for _, s := range g.streams {
		if s != nil {
			s.s.SetReadDeadline(d)
		}
	}
}

// Accept hands the core one inbound stream. verified is the peer name from
// the connection's certificate, or "" on an insecure transport. It returns
// at once: the Hello is read under a short deadline in a goroutine, and a
// stream whose Hello is malformed, names another peer than verified, or
// names an unknown channel is closed and logged. Safe for concurrent use.
func (t *Transport) Accept(verified transport.PeerID, s InStream) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		s.Close()
		return
	}
	accepted := t.reopens
	t.goLocked(func() { t.serveStream(verified, s, accepted) })
}

func (t *Transport) serveStream(verified transport.PeerID, s InStream, accepted uint64) {
	stop := context.AfterFunc(t.ctx, func() { s.Close() })
	s.SetReadDeadline(time.Now().Add(helloTimeout))
	h, err := wire.ReadHello(s)
	s.SetReadDeadline(time.Time{})
	if !stop() {
		return // closed; the stream is closed too
	}
	// An authenticated peer's stream that ends before its hello, not
	// one whose hello is wrong: it reset the stream as it cancelled a
	// send, as a recovery does.
	cut := err != nil && verified != "" && !errors.Is(err, wire.ErrMalformed)
	if err == nil {
		switch {
		case verified != "" && h.From != string(verified):
			err = fmt.Errorf("hello names %q but the certificate names %q", h.From, verified)
		case h.Channel >= uint8(transport.NumChannels):
			err = fmt.Errorf("hello for unknown channel %d", h.Channel)
		}
	}
	if err != nil {
		s.Close()
		ev := t.log.Warn()
		if errors.Is(err, io.EOF) || cut { // EOF: a link's spare connection, closed unused
			ev = t.log.Debug()
		}
		ev.Str("verified", string(verified)).Str("from", h.From).Err(err).Msg("rejected stream: bad hello")
		return
	}
	t.register(transport.PeerID(h.From), h, s, accepted)
}

// register adds an accepted stream to its (peer, channel) slot.
func (t *Transport) register(id transport.PeerID, h wire.Hello, s InStream, accepted uint64) {
	is := &inStream{s: s}
	is.r = wire.NewReader(is, t.cfg.Limits)
	k := int(h.Stripes)

	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		s.Close()
		return
	}
	sl := t.slotLocked(t.peerLocked(id), transport.Channel(h.Channel))
	var g *inGen
	if n := len(sl.gens); n > 0 {
		if last := sl.gens[n-1]; last.err == nil && last.k == k && last.streams[h.Stripe] == nil {
			g = last
		}
	}
	if g == nil {
		// A new generation. Dead ones are dropped now: their error has
		// been reported, and a successor makes later Recvs use it.
		live := sl.gens[:0]
		for _, old := range sl.gens {
			if old.err == nil {
				live = append(live, old)
			}
		}
		clear(sl.gens[len(live):])
		sl.gens = live
		var evicted []io.Closer
		if len(live) >= maxGens {
			// The oldest streams are the likeliest to belong to a session
			// of the peer that is long gone (a channel nobody reads never
			// notices its streams closing), so they make room.
			old := sl.gens[0]
			evicted = old.killLocked(&transport.PeerError{Peer: id, Op: "recv", Err: errSuperseded}, nil)
			copy(sl.gens, sl.gens[1:])
			sl.gens[len(sl.gens)-1] = nil
			sl.gens = sl.gens[:len(sl.gens)-1]
			t.log.Warn().Str("peer", string(id)).Stringer("channel", transport.Channel(h.Channel)).
				Msg("peer reopened the channel too often; closed its oldest unread streams")
		}
		defer func() {
			for _, c := range evicted {
				c.Close()
			}
		}()
		if len(live) > 0 {
			t.log.Info().Str("peer", string(id)).Stringer("channel", transport.Channel(h.Channel)).
				Msg("peer reopened the channel; new streams queue behind the old")
		}
		g = &inGen{accepted: accepted, k: k, streams: make([]*inStream, k)}
		sl.gens = append(sl.gens, g)
	}
	g.accepted = min(g.accepted, accepted)
	g.streams[h.Stripe] = is
	sl.signalLocked()
	t.mu.Unlock()
}

// Recv reads the next message from peer on ch into buf. It waits for the
// peer's stream to arrive, then reads straight into buf, over every stripe
// at once for a striped message. It does not allocate per message.
// At most one Recv at a time per (peer, channel).
//
// Errors: ctx.Err() if ctx ends (if that interrupted a message, the stream
// is out of step and later Recvs return a PeerError); transport.ErrClosed;
// an error wrapping wire.ErrShortBuffer, with the stream in step; otherwise
// a *transport.PeerError. Malformed or oversized input also drops the peer,
// as Drop does (Config.OnDrop included).
func (t *Transport) Recv(ctx context.Context, id transport.PeerID, ch transport.Channel, buf []byte) (wire.Header, int, error) {
	if err := checkChannel(ch); err != nil {
		return wire.Header{}, 0, err
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return wire.Header{}, 0, transport.ErrClosed
	}
	sl := t.slotLocked(t.peerLocked(id), ch)
	t.mu.Unlock()

	if err := sl.cc.begin(ctx); err != nil {
		if err == errReleased {
			err = transport.ErrClosed
		}
		return wire.Header{}, 0, err
	}
	h, n, err := sl.recv(ctx, buf)
	t.mu.Lock()
	if sl.cc.endLocked() && sl.cur != nil && sl.cur.err == nil {
		sl.cur.setDeadlineLocked(time.Time{})
	}
	sl.cur = nil
	t.mu.Unlock()
	return h, n, err
}

// cancelLocked runs when the context of a Recv ends: a past deadline makes
// the blocked reads return. t.mu is held.
func (sl *inSlot) cancelLocked() {
	if sl.cur != nil {
		sl.cur.setDeadlineLocked(longAgo)
	}
}

// abort makes every read of g return, after a stripe failed: the message
// can no longer complete.
func (sl *inSlot) abort(g *inGen) {
	sl.t.mu.Lock()
	g.setDeadlineLocked(longAgo)
	sl.t.mu.Unlock()
}

func (sl *inSlot) recv(ctx context.Context, buf []byte) (wire.Header, int, error) {
	t := sl.t
	for {
		g, s0, err := sl.waitStream(ctx, nil, 0)
		if err != nil {
			return wire.Header{}, 0, err
		}
		h, n, consumed, err := sl.readMessage(ctx, g, s0, buf)
		if err == nil || errors.Is(err, wire.ErrShortBuffer) {
			return h, n, err
		}

		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return h, 0, transport.ErrClosed
		}
		if g.err != nil { // dropped while reading
			err = g.err
			t.mu.Unlock()
			return h, 0, err
		}
		var closers []io.Closer
		var perr error
		retry := false
		switch {
		case ctx.Err() != nil && isTimeout(err):
			if consumed == 0 {
				t.mu.Unlock()
				return h, 0, ctx.Err() // nothing read: the stream is in step
			}
			perr = &transport.PeerError{Peer: sl.peer, Op: "recv",
				Err: fmt.Errorf("stream out of step: a receive was cancelled mid-message (%w)", ctx.Err())}
			closers = g.killLocked(perr, nil)
			t.log.Warn().Str("peer", string(sl.peer)).Stringer("channel", sl.ch).Msg("receive cancelled mid-message; closed the stream")
			err = ctx.Err()
		case consumed == 0 && errors.Is(err, io.EOF):
			perr = &transport.PeerError{Peer: sl.peer, Op: "recv",
				Err: t.byPeer(fmt.Errorf("peer closed its %v stream: %w", sl.ch, io.EOF))}
			closers = g.killLocked(perr, nil)
			// A newer generation follows, or the peer is reopening.
			retry = (len(sl.gens) > 1 && sl.gens[0] == g) || sl.reopened(g)
			if !retry {
				t.log.Debug().Str("peer", string(sl.peer)).Stringer("channel", sl.ch).Msg("peer closed the channel")
			}
			err = perr
		case errors.Is(err, wire.ErrMalformed) || errors.Is(err, wire.ErrTooLarge):
			t.mu.Unlock()
			t.links.failures.Add(1)
			t.Drop(sl.peer, err)
			return h, 0, &transport.PeerError{Peer: sl.peer, Op: "recv", Err: err}
		default:
			perr = &transport.PeerError{Peer: sl.peer, Op: "recv", Err: t.byPeer(err)}
			closers = g.killLocked(perr, nil)
			t.log.Debug().Str("peer", string(sl.peer)).Stringer("channel", sl.ch).Err(err).Msg("stream failed")
			err = perr
			// A reopening peer resets or cuts the streams it leaves
			// behind, a message in them included, which nobody waits for
			// any more: its next generation follows. Anything else is the
			// peer's loss.
			retry = sl.reopened(g) || (consumed == 0 && len(sl.gens) > 1 && sl.gens[0] == g)
			if !retry && (t.cfg.Orderly == nil || !t.cfg.Orderly(err)) {
				t.links.failures.Add(1)
			}
		}
		sl.signalLocked()
		t.mu.Unlock()
		for _, c := range closers {
			c.Close()
		}
		if !retry {
			return h, 0, err
		}
	}
}

// waitStream waits until stripe s of a generation has arrived and returns
// it. With g nil it waits for the head generation's stripe 0, skipping dead
// generations that have a successor, and makes it the one being read.
// With g given, it fails with errStripeMissing once g has a successor.
func (sl *inSlot) waitStream(ctx context.Context, g *inGen, s int) (*inGen, *inStream, error) {
	t := sl.t
	for {
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			return nil, nil, transport.ErrClosed
		}
		if sl.cc.firedLocked() {
			// Cancelled before this stream could be given a deadline.
			t.mu.Unlock()
			return nil, nil, ctx.Err()
		}
		if g == nil {
			for len(sl.gens) > 0 && sl.gens[0].err != nil && (len(sl.gens) > 1 || sl.reopened(sl.gens[0])) {
				copy(sl.gens, sl.gens[1:])
				sl.gens[len(sl.gens)-1] = nil
				sl.gens = sl.gens[:len(sl.gens)-1]
			}
		}
		var cand *inGen
		switch {
		case g != nil:
			cand = g
		case len(sl.gens) > 0:
			cand = sl.gens[0]
		}
		if cand != nil {
			if err := cand.err; err != nil {
				t.mu.Unlock()
				return nil, nil, err
			}
			if st := cand.streams[s]; st != nil {
				sl.cur = cand
				t.mu.Unlock()
				return cand, st, nil
			}
			if g != nil && (len(sl.gens) == 0 || sl.gens[len(sl.gens)-1] != g) {
				// Stripes join only the newest generation: this one's
				// missing stripe will never come to it (reset before its
				// hello, or late and given to the newer one).
				t.mu.Unlock()
				return nil, nil, errStripeMissing
			}
		}
		changed := sl.changed
		t.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-t.done:
			return nil, nil, transport.ErrClosed
		}
	}
}

// errStripeMissing: a generation's stripe never arrived, and a newer
// generation followed it. The message in the old one cannot complete.
var errStripeMissing = errors.New("a stripe of the message never arrived before the peer opened new streams")

// readMessage reads one message from generation g, whose stripe 0 is s0.
// consumed counts the bytes taken from stripe 0: any byte read means an
// interrupted message left the streams out of step (a striped message
// always reads stripe 0's first header before the other stripes).
func (sl *inSlot) readMessage(ctx context.Context, g *inGen, s0 *inStream, buf []byte) (h wire.Header, n int, consumed int64, err error) {
	start := s0.n
	defer func() { consumed = s0.n - start }()
	// The whole of stripe 0's part polls, not only the wait for the
	// header: a payload written apart from its header (shared memory
	// publishes each write at once) may land a moment after it, and a
	// reader that slept then would cost the peer a wake-up. Only small
	// collectives poll, so what follows the header is short.
	if p, ok := s0.s.(Poller); ok && transport.PollFrom(ctx) > 0 {
		p.SetPoll(transport.PollFrom(ctx))
		defer p.SetPoll(0)
	}
	f, err := s0.r.ReadFrameHeader()
	if err != nil {
		return h, 0, 0, err
	}
	h = f.Header
	if f.Offset != 0 {
		return h, 0, 0, fmt.Errorf("%w: message starts at offset %d", wire.ErrMalformed, f.Offset)
	}
	discard := h.Len > uint64(len(buf))
	used := wire.StripesUsed(h.Len, g.k)

	// Hand stripes 1..used-1 to their readers, then read stripe 0 here.
	sent := 1
	for ; sent < used; sent++ {
		var st *inStream
		if _, st, err = sl.waitStream(ctx, g, sent); err != nil {
			break
		}
		r, rerr := sl.reader(sent)
		if rerr != nil {
			err = rerr
			break
		}
		lo, hi := wire.StripePart(h.Len, g.k, sent)
		select {
		case r.jobs <- readJob{sl: sl, g: g, s: st, h: h, lo: lo, hi: hi, buf: buf, discard: discard}:
			continue
		case <-sl.quit:
			err = errForgotten
		case <-sl.t.done:
			err = transport.ErrClosed
		}
		break
	}
	if err == nil {
		_, hi := wire.StripePart(h.Len, g.k, 0)
		err = readPart(s0, h, 0, hi, buf, discard, &sl.scratch, f, true)
	}
	if err != nil && sent > 1 {
		sl.abort(g)
	}
	for s := 1; s < sent; s++ {
		err = worse(err, <-sl.readers[s].done)
	}
	if err != nil {
		return h, 0, 0, err
	}
	if discard {
		return h, 0, 0, fmt.Errorf("%w: %d bytes into %d", wire.ErrShortBuffer, h.Len, len(buf))
	}
	return h, int(h.Len), 0, nil
}

// worse returns the more telling of two errors: a real failure rather than
// the timeout that aborting the other stripes caused.
func worse(a, b error) error {
	if a == nil || (b != nil && isTimeout(a) && !isTimeout(b)) {
		return b
	}
	return a
}

func isTimeout(err error) bool {
	var te interface{ Timeout() bool }
	return errors.As(err, &te) && te.Timeout()
}

// reader returns stripe s's reader, starting it on first use.
func (sl *inSlot) reader(s int) (*stripeReader, error) {
	if s >= len(sl.readers) {
		sl.readers = append(sl.readers, make([]*stripeReader, s+1-len(sl.readers))...)
	}
	if r := sl.readers[s]; r != nil {
		return r, nil
	}
	r := &stripeReader{jobs: make(chan readJob), done: make(chan error, 1)}
	t := sl.t
	if !t.spawn(func() { r.run(t.done, sl.quit) }) {
		return nil, transport.ErrClosed
	}
	sl.readers[s] = r
	return r, nil
}

// stripeReader reads parts of striped messages from one stripe. It is a
// persistent goroutine so that a striped Recv allocates nothing.
type stripeReader struct {
	jobs    chan readJob
	done    chan error // one result per job taken
	scratch []byte
}

type readJob struct {
	sl      *inSlot
	g       *inGen
	s       *inStream
	h       wire.Header
	lo, hi  uint64
	buf     []byte
	discard bool
}

func (r *stripeReader) run(done, quit <-chan struct{}) {
	for {
		select {
		case <-quit:
			return
		case j := <-r.jobs:
			err := readPart(j.s, j.h, j.lo, j.hi, j.buf, j.discard, &r.scratch, wire.FrameHeader{}, false)
			if err != nil {
				j.sl.abort(j.g)
			}
			r.done <- err
		case <-done:
			return
		}
	}
}

// discardChunk is the scratch size for skipping a message that does not
// fit: fixed, whatever length the peer announced.
const discardChunk = 32 << 10

// readPart reads the frames that carry bytes [lo, hi) of message h from s
// into buf[lo:hi], or skips them if discard. If have, f is a frame header
// of the part already read. Every frame must repeat h and continue exactly
// where the previous one ended.
func readPart(s *inStream, h wire.Header, lo, hi uint64, buf []byte, discard bool, scratch *[]byte, f wire.FrameHeader, have bool) error {
	for got := lo; ; {
		if !have {
			if got == hi {
				return nil
			}
			var err error
			if f, err = s.r.ReadFrameHeader(); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		have = false
		if f.Header != h || f.Offset != got || uint64(f.Size) > hi-got {
			return fmt.Errorf("%w: frame [%d,+%d) does not continue the stripe's part [%d,%d) at %d",
				wire.ErrMalformed, f.Offset, f.Size, lo, hi, got)
		}
		size := uint64(f.Size)
		if !discard {
			if err := s.r.ReadPayload(buf[got : got+size]); err != nil {
				return err
			}
		} else {
			if *scratch == nil {
				*scratch = make([]byte, discardChunk)
			}
			for left := size; left > 0; {
				c := min(left, discardChunk)
				if err := s.r.ReadPayload((*scratch)[:c]); err != nil {
					return err
				}
				left -= c
			}
		}
		got += size
		if got == hi {
			return nil
		}
	}
}
