package streams

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// outPeer is the sending side of one peer: its links and its channels.
type outPeer struct {
	t     *Transport
	id    transport.PeerID
	addr  string        // as given to Connect, for links dialed later
	ready chan struct{} // closed once Connect has finished
	err   error         // Connect's result; read after ready
	local bool          // its links are shared memory; set before ready closes
	// links has one link per stripe dialed so far: Connect's, then those
	// dialed when a channel's stripe count first needs them. Guarded by
	// t.mu (appended to while killLocked may run); an element never
	// changes once appended.
	links   []Link
	dialing chan struct{}                   // a token held while dialing a link, so one dial at a time
	dead    error                           // why it was dropped or closed; guarded by t.mu
	chans   [transport.NumChannels]*outChan // guarded by t.mu
}

func newOutPeer(t *Transport, id transport.PeerID, addr string) *outPeer {
	return &outPeer{t: t, id: id, addr: addr, ready: make(chan struct{}), dialing: make(chan struct{}, 1)}
}

// stripes is how many stripes ch's next generation to op uses.
func (op *outPeer) stripes(ch transport.Channel) int {
	if op.local {
		return 1
	}
	return int(op.t.stripes[ch].Load())
}

// dialError is a failure to dial a link a stripe needed after Connect.
type dialError struct{ err error }

func (e *dialError) Error() string { return "dial: " + e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// link returns the link of stripe s, dialing the links up to it that
// Connect did not. A link dialed after op was dropped or closed is closed
// at once, as killLocked cannot have seen it.
func (op *outPeer) link(ctx context.Context, s int) (Link, error) {
	t := op.t
	t.mu.Lock()
	if s < len(op.links) {
		l := op.links[s]
		t.mu.Unlock()
		return l, nil
	}
	t.mu.Unlock()
	select {
	case op.dialing <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.done:
		return nil, transport.ErrClosed
	}
	defer func() { <-op.dialing }()
	for {
		t.mu.Lock()
		switch {
		case t.closed:
			t.mu.Unlock()
			return nil, transport.ErrClosed
		case op.dead != nil:
			t.mu.Unlock()
			return nil, op.dead
		case s < len(op.links):
			l := op.links[s]
			t.mu.Unlock()
			return l, nil
		}
		n := len(op.links)
		t.mu.Unlock()
		l, err := t.cfg.Dial(ctx, op.id, op.addr)
		if err != nil {
			return nil, &dialError{err}
		}
		t.mu.Lock()
		if t.closed || op.dead != nil {
			t.mu.Unlock()
			l.Close()
			continue // returns why
		}
		op.links = append(op.links, l)
		t.mu.Unlock()
		t.log.Debug().Str("peer", string(op.id)).Int("link", n).Msg("dialed a link for a stripe")
	}
}

// killLocked marks op dead and appends what must be closed. t.mu is held.
func (op *outPeer) killLocked(reason error, closers []io.Closer) []io.Closer {
	if op.dead != nil {
		return closers
	}
	op.dead = reason
	for _, l := range op.links {
		closers = append(closers, l)
	}
	for _, oc := range op.chans {
		if oc != nil {
			closers = append(closers, oc)
		}
	}
	return closers
}

// outChan is the sending side of one (peer, channel). Senders take sem in
// turn, so messages never interleave; the holder of sem owns streams'
// slots and the writers.
type outChan struct {
	op  *outPeer
	ch  transport.Channel
	sem chan struct{}

	mu      sync.Mutex // guards dead, cc and writes to streams and writers; the sem holder reads without it
	dead    bool
	streams []*outStream // one per stripe of the generation, opened lazily; resized only by the sem holder, between generations

	writers []*stripeWriter // one per stripe above 0, started lazily, stopped by Close or when a generation has fewer stripes
	cc      canceller       // closes the streams when a Send's ctx ends
}

// outStream is one open outbound stream.
type outStream struct {
	s      Stream
	w      *wire.Writer
	closed atomic.Bool
}

func (s *outStream) close() {
	if s.closed.CompareAndSwap(false, true) {
		s.s.Close()
	}
}

// Close closes the channel's streams for good and stops its stripe
// writers (Drop, Close), so that a dropped peer leaves no goroutine behind.
func (oc *outChan) Close() error {
	oc.mu.Lock()
	if !oc.dead {
		for _, w := range oc.writers {
			if w != nil {
				close(w.quit)
			}
		}
	}
	oc.dead = true
	oc.cc.releaseLocked()
	for _, s := range oc.streams {
		if s != nil {
			s.close()
		}
	}
	oc.mu.Unlock()
	return nil
}

// resetStreams closes and forgets the open streams; the next Send opens
// new ones. It is called when a stream may be out of step.
func (oc *outChan) resetStreams() {
	oc.mu.Lock()
	for i, s := range oc.streams {
		if s != nil {
			s.close()
			oc.streams[i] = nil
		}
	}
	oc.mu.Unlock()
}

// cancelLocked unblocks a Send whose context ended: closing is the only
// way to interrupt a Write on every Stream. oc.mu is held.
func (oc *outChan) cancelLocked() {
	for _, s := range oc.streams {
		if s != nil {
			s.close()
		}
	}
}

// abort closes the streams after one stripe failed, to unblock the others.
func (oc *outChan) abort() {
	oc.mu.Lock()
	oc.cancelLocked()
	oc.mu.Unlock()
}

// Send writes one message to peer on ch. Messages of at least wire.StripeMin
// bytes are split over the stripes. It blocks until the payload has been
// written to the streams (so payload may be reused), ctx is done, or the
// transport closes. Senders on one (peer, channel) take turns.
func (t *Transport) Send(ctx context.Context, id transport.PeerID, ch transport.Channel, hdr wire.Header, payload []byte) error {
	if err := checkChannel(ch); err != nil {
		return err
	}
	if err := hdr.Validate(); err != nil {
		return fmt.Errorf("streams: send to %s: %w", id, err)
	}
	oc, err := t.outChan(id, ch)
	if err != nil {
		return err
	}
	select {
	case oc.sem <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-t.done:
		return transport.ErrClosed
	}
	err = oc.send(ctx, hdr, payload)
	<-oc.sem
	return err
}

// Reopen closes the open streams of (id, ch), if the channel has any:
// the next Send opens a new generation (transport.Reopener). The peer
// reopens its side too, so the generations accepted from it before
// now are left behind: when one ends or fails, even mid-message, Recv
// waits for the peer's next one instead of failing. (A generation the
// peer opened after its own Reopen but before this one counts as left
// behind too: a failure of it waits too, until the watchdogs above.)
func (t *Transport) Reopen(id transport.PeerID, ch transport.Channel) {
	if checkChannel(ch) != nil {
		return
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	var oc *outChan
	p := t.peerLocked(id)
	if p.out != nil {
		oc = p.out.chans[ch]
	}
	sl := t.slotLocked(p, ch)
	t.reopens++
	sl.reopenedAt = t.reopens
	sl.signalLocked()
	t.mu.Unlock()
	if oc != nil {
		oc.resetStreams()
	}
}

// outChan returns the sending side of (id, ch), or ErrNotConnected.
func (t *Transport) outChan(id transport.PeerID, ch transport.Channel) (*outChan, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, transport.ErrClosed
	}
	p := t.peers[id]
	if p == nil || p.out == nil {
		return nil, fmt.Errorf("%w: %s", transport.ErrNotConnected, id)
	}
	op := p.out
	select {
	case <-op.ready:
	default:
		return nil, fmt.Errorf("%w: %s (still connecting)", transport.ErrNotConnected, id)
	}
	oc := op.chans[ch]
	if oc == nil {
		k := op.stripes(ch)
		oc = &outChan{
			op:      op,
			ch:      ch,
			sem:     make(chan struct{}, 1),
			streams: make([]*outStream, k),
			writers: make([]*stripeWriter, k),
		}
		oc.cc = canceller{mu: &oc.mu, onCancel: oc.cancelLocked}
		op.chans[ch] = oc
	}
	return oc, nil
}

// send writes one message. The caller holds oc.sem.
func (oc *outChan) send(ctx context.Context, hdr wire.Header, payload []byte) error {
	t := oc.op.t
	hdr.Len = uint64(len(payload))
	err := oc.restripe()
	used := wire.StripesUsed(hdr.Len, len(oc.streams))
	// Opening honours ctx by itself and writes nothing of the message, so
	// only the writes are armed for cancellation: a Send cancelled before
	// them leaves the streams in step.
	for s := 0; s < used && err == nil; s++ {
		if oc.streams[s] == nil {
			err = oc.open(ctx, s)
		}
	}
	if err == nil {
		if err = oc.cc.begin(ctx); err == nil {
			err = oc.write(hdr, payload, used)
			oc.mu.Lock()
			fired := oc.cc.endLocked()
			oc.mu.Unlock()
			if fired || err != nil {
				// Out of step, or closed by the cancel: the next Send
				// starts on new streams.
				t.log.Debug().Str("peer", string(oc.op.id)).Stringer("channel", oc.ch).Bool("cancelled", fired).
					AnErr("error", err).Msg("send cut short; the next send opens new streams")
				oc.resetStreams()
			}
			if err == nil {
				return nil // written in full, even if a cancel came after
			}
		}
	}
	if err != errReleased && ctx.Err() != nil {
		return ctx.Err()
	}
	t.mu.Lock()
	closed, dead := t.closed, oc.op.dead
	t.mu.Unlock()
	switch {
	case closed:
		return transport.ErrClosed
	case dead != nil:
		err = dead
	default:
		var de *dialError
		if errors.As(err, &de) {
			t.links.dialErrors.Add(1)
		}
		// The link failed under us (the peer crashed, restarted, or
		// dropped this process). Abandon the link, so that a later Connect
		// dials afresh instead of reporting the dead link as connected.
		// Only this side's link: the connections the peer dialled say
		// nothing about it, and closing them would make a live peer fail
		// its next send and abandon the link this side may have dialled
		// again meanwhile, over and over.
		t.abandonLink(oc.op, err)
	}
	return &transport.PeerError{Peer: oc.op.id, Op: "send", Err: t.byPeer(err)}
}

// restripe sizes the channel for the stripe count set now, if no stream
// of it is open: a generation keeps the count its first stream announced,
// and a new one starts with all streams closed. The writers of stripes
// dropped stop. The caller holds oc.sem.
func (oc *outChan) restripe() error {
	k := oc.op.stripes(oc.ch)
	if k == len(oc.streams) {
		return nil
	}
	oc.mu.Lock()
	defer oc.mu.Unlock()
	if oc.dead {
		return errStreamClosed
	}
	for _, s := range oc.streams {
		if s != nil {
			return nil // mid-generation
		}
	}
	for s := k; s < len(oc.writers); s++ {
		if w := oc.writers[s]; w != nil {
			close(w.quit) // idle: only the sem holder gives it work
			oc.writers[s] = nil
		}
	}
	oc.streams = resize(oc.streams, k)
	oc.writers = resize(oc.writers, k)
	return nil
}

// resize returns s with length k, keeping its array if it can. Whatever
// lies between len(s) and k must be zero, as restripe leaves it.
func resize[T any](s []T, k int) []T {
	if k <= cap(s) {
		return s[:k]
	}
	return append(s, make([]T, k-len(s))...)
}

// write writes the parts of a message over used stripes, whose streams
// are open: stripe 0 on this goroutine and the others on their writers.
func (oc *outChan) write(hdr wire.Header, payload []byte, used int) error {
	if used == 1 {
		return oc.streams[0].w.WriteFrames(hdr, payload, 0)
	}
	t := oc.op.t
	k := len(oc.streams)
	var err error
	sent := 1
	for ; sent < used; sent++ {
		lo, hi := wire.StripePart(hdr.Len, k, sent)
		w := oc.writers[sent]
		select {
		case w.jobs <- writeJob{w: oc.streams[sent].w, h: hdr, part: payload[lo:hi], off: lo}:
			continue
		case <-w.quit:
			err = errStreamClosed
		case <-t.done:
			err = transport.ErrClosed
		}
		break
	}
	if err == nil {
		_, hi := wire.StripePart(hdr.Len, k, 0)
		err = oc.streams[0].w.WriteFrames(hdr, payload[:hi], 0)
		if err != nil {
			oc.abort() // unblock the other stripes; they are out of step too
		}
	}
	for s := 1; s < sent; s++ {
		if werr := <-oc.writers[s].done; werr != nil && err == nil {
			err = werr
			oc.abort()
		}
	}
	return err
}

// open opens stripe s's stream on the link of that stripe and sends the
// Hello. The caller holds oc.sem.
func (oc *outChan) open(ctx context.Context, s int) error {
	t := oc.op.t
	if s > 0 && oc.writers[s] == nil {
		w := &stripeWriter{jobs: make(chan writeJob), done: make(chan error, 1), quit: make(chan struct{})}
		if !t.spawn(func() { w.run(t.done) }) {
			return transport.ErrClosed
		}
		oc.mu.Lock()
		dead := oc.dead
		if dead {
			close(w.quit) // Close ran meanwhile and did not see it
		} else {
			oc.writers[s] = w
		}
		oc.mu.Unlock()
		if dead {
			return errStreamClosed
		}
	}
	l, err := oc.op.link(ctx, s)
	if err != nil {
		return err
	}
	st, err := l.OpenStream(ctx, oc.ch)
	if err != nil {
		return fmt.Errorf("open stream: %w", err)
	}
	os := &outStream{s: st, w: wire.NewWriter(st, t.cfg.Limits.MaxFrame)}
	oc.mu.Lock()
	if oc.dead {
		oc.mu.Unlock()
		st.Close()
		return errStreamClosed
	}
	oc.streams[s] = os
	oc.mu.Unlock()
	hello := wire.AppendHello(make([]byte, 0, 16+len(t.cfg.ID)), wire.Hello{
		From:    string(t.cfg.ID),
		Channel: uint8(oc.ch),
		Stripe:  uint8(s),
		Stripes: uint8(len(oc.streams)),
	})
	if _, err := st.Write(hello); err != nil {
		oc.mu.Lock()
		os.close()
		oc.streams[s] = nil
		oc.mu.Unlock()
		return fmt.Errorf("write hello: %w", err)
	}
	return nil
}

var errStreamClosed = errors.New("stream closed")

// spawn starts f as a goroutine that Close waits for, unless the transport
// is closed.
func (t *Transport) spawn(f func()) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.goLocked(f)
	return true
}

// stripeWriter writes the parts of striped messages to one stripe. It is
// a persistent goroutine so that a striped Send allocates nothing; it ends
// when its channel is closed (quit) or the transport is.
type stripeWriter struct {
	jobs chan writeJob
	done chan error    // one result per job taken
	quit chan struct{} // closed by outChan.Close
}

type writeJob struct {
	w    *wire.Writer
	h    wire.Header
	part []byte
	off  uint64
}

func (sw *stripeWriter) run(done <-chan struct{}) {
	for {
		select {
		case j := <-sw.jobs:
			sw.done <- j.w.WriteFrames(j.h, j.part, j.off)
		case <-sw.quit:
			return
		case <-done:
			return
		}
	}
}
