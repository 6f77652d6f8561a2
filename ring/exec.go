package ring

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/transport"
)

// This file is the executor: it runs one Plan over a transport.Transport as
// Plan's documentation describes. The receive walker runs on the caller's
// goroutine and the send walker on a goroutine the Comm keeps; a plan
// small enough for the transport's send buffer runs both on the caller's
// goroutine (walkInline). The collective's deadline and the caller's
// context end the op context through callbacks registered once
// (time.AfterFunc, context.AfterFunc), and a kept watchdog goroutine
// checks the members' liveness, so that a collective starts and ends
// without waking any other goroutine. The goroutines exchange only
// preallocated values over channels, so a collective in steady state
// allocates nothing.

// Internal causes of an op context's cancellation. They never reach the
// caller: run translates them.
var (
	errDeadline   = errors.New("ring: deadline")
	errSilent     = errors.New("ring: a member is silent")
	errSendFailed = errors.New("ring: the second walker failed") // or the sends, after a hand-off
	errStopped    = errors.New("ring: stopped after a failure")
)

// opCtx makes the context.Context of the collective in progress, an
// opView. The view is reused from one collective to the next, and so is
// its Done channel, as long as it was not cancelled: creating a context
// per collective would allocate, and the transports register
// context.AfterFunc once per distinct Done channel, which allocates too.
// After a cancellation, begin makes a new view; the cancelled one keeps
// its error for good, as the context contract requires of a context whose
// Done is closed: a callback the transports registered on it may read Err
// after the next collective has begun.
//
// It follows the caller's context through a context.AfterFunc on its
// Done channel. A parent passed to two collectives in a row, as a training
// loop passes its context, keeps its registration for as long as it
// comes back; one passed once (a context per call) is unregistered at the
// collective's end, so that cancelling it later starts no callback.
type opCtx struct {
	mu       sync.Mutex
	cur      *opView
	parent   context.Context
	deadline time.Time
	// active is set from begin to end: only then may a cancellation
	// land. gen counts begins, so that a check made during one
	// collective cannot cancel the next (cancelGen).
	active bool
	gen    uint64
	// closeErr, once shutdown ran, ends every later collective.
	closeErr error
	// regDone is the parent Done channel the callback watches, stopReg
	// its stop function; keep says to keep it past end. prevDone is the
	// previous collective's parent Done channel.
	regDone, prevDone <-chan struct{}
	stopReg           func() bool
	keep              bool
}

// opView is the context an opCtx hands out between two cancellations.
type opView struct {
	c    *opCtx
	done chan struct{}
	// err, and the deadline it froze, are set once, under c.mu, when
	// done is closed.
	err      error
	deadline time.Time
}

func newOpCtx() *opCtx {
	c := &opCtx{parent: context.Background()}
	c.cur = &opView{c: c, done: make(chan struct{})}
	return c
}

// deadlineLocked is the earlier of the collective's deadline and its
// parent's.
func (c *opCtx) deadlineLocked() time.Time {
	if d, ok := c.parent.Deadline(); ok && d.Before(c.deadline) {
		return d
	}
	return c.deadline
}

// Deadline returns the collective's deadline, or its parent's if that is
// earlier; a cancelled view's stays the one it had then.
func (v *opView) Deadline() (time.Time, bool) {
	v.c.mu.Lock()
	defer v.c.mu.Unlock()
	if v.err != nil {
		return v.deadline, true
	}
	return v.c.deadlineLocked(), true
}

func (v *opView) Done() <-chan struct{} { return v.done }

func (v *opView) Err() error {
	v.c.mu.Lock()
	defer v.c.mu.Unlock()
	return v.err
}

// Value returns nil: the op context carries no values. Passing the
// parent's through would also pass its internal cancellation record, and
// context.Cause would then report the parent's cause, nil, for an op
// context that has ended.
func (v *opView) Value(key any) any { return nil }

// cancel ends the context with err unless it has ended already.
func (c *opCtx) cancel(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cancelLocked(err)
}

func (c *opCtx) cancelLocked(err error) {
	if v := c.cur; v.err == nil {
		v.err, v.deadline = err, c.deadlineLocked()
		close(v.done)
	}
}

// begin readies the context for a collective under parent that must end
// by deadline, and returns the view the collective runs under.
func (c *opCtx) begin(parent context.Context, deadline time.Time) *opView {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	c.active = true
	c.parent, c.deadline = parent, deadline
	if c.closeErr != nil {
		// Ended for good by shutdown, with its error rather than what
		// ended an earlier collective.
		if c.cur.err != c.closeErr {
			c.cur = &opView{c: c, done: make(chan struct{})}
			c.cancelLocked(c.closeErr)
		}
		return c.cur
	}
	if c.cur.err != nil {
		c.cur = &opView{c: c, done: make(chan struct{})}
	}
	pd := parent.Done()
	if pd != nil && pd != c.regDone {
		c.unregisterLocked()
		c.regDone = pd
		c.stopReg = context.AfterFunc(parent, func() { c.parentDone(pd) })
	}
	c.keep = pd != nil && pd == c.prevDone
	c.prevDone = pd
	// A parent that ended between collectives fired its callback while
	// none was active.
	if err := parent.Err(); err != nil {
		c.cancelLocked(err)
	}
	return c.cur
}

// end marks the collective over: later cancellations wait for the next.
func (c *opCtx) end() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.active = false
	if !c.keep {
		c.unregisterLocked()
	}
}

func (c *opCtx) unregisterLocked() {
	if c.stopReg != nil {
		c.stopReg()
		c.stopReg, c.regDone = nil, nil
	}
}

// parentDone is the callback on the parent whose Done channel is pd.
func (c *opCtx) parentDone(pd <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active && c.parent.Done() == pd {
		c.cancelLocked(c.parent.Err())
	}
}

// activeGen returns the generation of the collective in progress, if
// one is.
func (c *opCtx) activeGen() (uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gen, c.active
}

// cancelGen ends the context with err if collective gen is still in
// progress and has not ended otherwise, calling first, under the lock,
// before: what it records is then read only for this cancellation.
func (c *opCtx) cancelGen(gen uint64, err error, before func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.active && c.gen == gen && c.cur.err == nil {
		before()
		c.cancelLocked(err)
	}
}

// shutdown ends the collective in progress, if any, and every later one
// with err, and drops the parent callback.
func (c *opCtx) shutdown(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closeErr = err
	c.cancelLocked(err)
	c.unregisterLocked()
}

// op is the state of the collective in progress, shared by the walkers.
// The Comm owns one and reuses it.
type op struct {
	c *Comm
	// ctx is the collective's context, c.ctx's view once begun.
	ctx     *opView
	plan    *Plan
	data    []byte
	scratch []byte
	es      int  // element size in bytes
	inline  bool // runs on the caller's goroutine (Comm.inline)
	hdr     wire.Header
	kdt     kernels.DType
	kop     kernels.Op
	scale   float64 // Avg: multiply by this at each Final receive; 0 otherwise
	timeout time.Duration
	// codec is the wire compression, nil for none; then every message
	// passes through the scratches below (see compress.go).
	codec                    *codec
	sendScratch, recvScratch []uint16
	// image, for a compressed plan that forwards, holds the wire values
	// of the buffer: sends encode into it, and a send that forwards what
	// its receive left sends it as it is (forwards, keeps; compress.go).
	image           []uint16
	forwards, keeps []bool

	// sent and recvd count completed sends and receives: the one counter
	// per walker that After waits compare against.
	sent, recvd atomic.Int64
	// sendWake and recvWake carry a token after each completion, to wake
	// the other walker if it waits. One token of room suffices: each has
	// one reader, which rechecks the counter after waking.
	sendWake, recvWake chan struct{}
	// stall is where an inline collective stands with the second walker
	// (stallIdle, stallArmed while an inline send runs, stallHanded once
	// the receives from recvFrom on moved to it). sendSeq counts inline
	// sends, and seenSeq is the one the timer saw in flight last.
	stall            atomic.Int32
	recvFrom         atomic.Int64
	sendSeq, seenSeq atomic.Uint64
	// sendsDone carries a token from the caller once its sends end, after
	// a hand-off, to the second walker that took the receives.
	sendsDone chan struct{}
	// deadline is when the collective times out, in nanoseconds since
	// Comm.born (a monotonic clock).
	deadline atomic.Int64
	// stop asks the send walker to stop before its next send.
	stop    atomic.Bool
	sendErr error
	// waiting is the peer the receive walker is receiving from: read
	// after the walkers finish, to name the peer in a timeout, and by the
	// watchdog for a stall report.
	waiting atomic.Int32
}

func wake(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// waitRecvs waits until more than after receives have completed.
func (o *op) waitRecvs(after int) error {
	ctx := o.ctx
	for {
		if o.stop.Load() {
			return errStopped
		}
		if o.recvd.Load() > int64(after) {
			return nil
		}
		select {
		case <-o.recvWake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// waitSends waits until more than after sends have completed.
func (o *op) waitSends(after int) error {
	ctx := o.ctx
	for o.sent.Load() <= int64(after) {
		select {
		case <-o.sendWake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// walkSends runs the plan's sends in order.
func (o *op) walkSends() error { return o.walkSendsFrom(0) }

// walkSendsFrom runs the plan's sends from index i on.
func (o *op) walkSendsFrom(i int) error {
	for ; i < len(o.plan.Sends); i++ {
		if err := o.sendOne(i); err != nil {
			return err
		}
	}
	return nil
}

// sendOne runs send i once the receive it forwards has completed.
func (o *op) sendOne(i int) error {
	c, x := o.c, &o.plan.Sends[i]
	if err := o.waitRecvs(x.After); err != nil {
		return err
	}
	h := o.hdr
	h.Step, h.Chunk = uint32(x.Step), uint32(x.Chunk)
	payload := o.data[x.Off*o.es : x.End()*o.es]
	if o.codec != nil {
		var err error
		if payload, err = o.encodeSend(i); err != nil {
			return err
		}
	}
	if err := c.t.Send(o.ctx, c.members[x.Peer], c.cfg.Channel, h, payload); err != nil {
		if ce := o.ctx.Err(); ce != nil && errors.Is(err, ce) {
			return ce
		}
		return fmt.Errorf("ring: %v seq %d: send to %s (rank %d): %w",
			o.plan.Algo, o.hdr.Seq, c.members[x.Peer], x.Peer, err)
	}
	o.sent.Add(1)
	wake(o.sendWake)
	return nil
}

// States of op.stall.
const (
	stallIdle int32 = iota
	stallArmed
	stallHanded
)

// stallCheck is how often the watchdog looks for an inline send that
// blocks: one in flight at two checks in a row moves the receives to the
// second walker. A timer per collective would be cheaper to react but
// not to run: arming a near timer wakes the thread that waits for the
// network, which costs a small collective more than its messages.
const stallCheck = 100 * time.Millisecond

// walkInline runs the plan's sends and receives on this goroutine: each
// send as soon as the receive it forwards has completed, otherwise the
// next receive. With sends that never block, that is the two walkers'
// schedule, in which a Reduce receive never waits for its send: that send
// depends only on earlier receives. A send can block, though, if the
// transport's buffer is fuller than Comm.inline assumed; then, within two
// stallChecks, the second walker takes over the receives from where this
// one stands (checkStall), and this goroutine goes on as the send walker.
// It reports whether it handed the receives over.
func (o *op) walkInline() (handed bool, err error) {
	p := o.plan
	i := 0
	for j := 0; ; j++ {
		for ; i < len(p.Sends) && p.Sends[i].After < j; i++ {
			o.waiting.Store(int32(p.Sends[i].Peer)) // a send that blocks till the deadline names its peer
			o.recvFrom.Store(int64(j))
			o.sendSeq.Add(1)
			o.stall.Store(stallArmed)
			err := o.sendOne(i)
			if !o.stall.CompareAndSwap(stallArmed, stallIdle) {
				if err == nil {
					err = o.walkSendsFrom(i + 1)
				}
				return true, err
			}
			if err != nil {
				return false, err
			}
		}
		if j == len(p.Recvs) {
			if i < len(p.Sends) {
				return false, fmt.Errorf("ring: %v plan: send %d waits for receive %d of %d", p.Algo, i, p.Sends[i].After, len(p.Recvs))
			}
			o.waiting.Store(-1)
			return false, nil
		}
		if err := o.recvOne(j); err != nil {
			return false, err
		}
	}
}

// walkRecvs runs the plan's receives in order.
func (o *op) walkRecvs() error { return o.walkRecvsFrom(0) }

// walkRecvsFrom runs the plan's receives from index j on. Having
// received them all, it waits for nobody (op.waiting).
func (o *op) walkRecvsFrom(j int) error {
	for ; j < len(o.plan.Recvs); j++ {
		if err := o.recvOne(j); err != nil {
			return err
		}
	}
	o.waiting.Store(-1)
	return nil
}

// recvOne runs receive j, and its reduction or copy into the buffer.
func (o *op) recvOne(j int) error {
	c, x := o.c, &o.plan.Recvs[j]
	if o.codec != nil {
		o.waiting.Store(int32(x.Peer))
		if err := o.recvCompressed(j); err != nil {
			return err
		}
		o.recvd.Add(1)
		wake(o.recvWake)
		return nil
	}
	span := o.data[x.Off*o.es : x.End()*o.es]
	// Overwriting receives go straight into the buffer, unless leftovers
	// of an aborted collective may still be queued from the peer: a
	// stale message must not overwrite data a send has yet to read.
	direct := !x.Reduce && !c.dirty[x.Peer]
	buf := span
	if !direct {
		buf = o.scratch[:len(span)]
	}
	if direct && x.After >= 0 {
		// Receiving writes the span at once: first let the earlier send
		// that read it return.
		if err := o.waitSends(x.After); err != nil {
			return err
		}
	}
	o.waiting.Store(int32(x.Peer))
	if err := o.recv(x, buf); err != nil {
		return err
	}
	switch {
	case x.Reduce:
		// The message is off the transport; only now wait for the send
		// that still reads the span, else recursive doubling deadlocks.
		if err := o.waitSends(x.After); err != nil {
			return err
		}
		if err := kernels.ReduceBytes(o.kdt, o.kop, span, buf); err != nil {
			return fmt.Errorf("ring: reduce: %w", err)
		}
		if x.Final && o.scale != 0 {
			if err := kernels.ScaleBytes(o.kdt, span, o.scale); err != nil {
				return fmt.Errorf("ring: scale: %w", err)
			}
		}
	case !direct:
		if err := o.waitSends(x.After); err != nil {
			return err
		}
		copy(span, buf)
	}
	o.recvd.Add(1)
	wake(o.recvWake)
	return nil
}

// recv takes the message for x off the transport into buf, discarding
// leftovers of earlier collectives, and checks its header.
func (o *op) recv(x *Xfer, buf []byte) error {
	c := o.c
	peer := c.members[x.Peer]
	// An inline collective's receives may poll (SetPoll): no walker of
	// this Comm needs the core meanwhile. Once a stalled send handed the
	// receives to the second walker, the caller's sends need it. With
	// SetPollAll every collective's receives poll.
	var ctx context.Context = o.ctx
	if (o.inline || c.pollAll) && c.pollCtx != nil && o.stall.Load() != stallHanded {
		ctx = c.pollCtx
	}
	for {
		h, n, err := c.t.Recv(ctx, peer, c.cfg.Channel, buf)
		if err != nil && !errors.Is(err, wire.ErrShortBuffer) {
			if ce := o.ctx.Err(); ce != nil && errors.Is(err, ce) {
				return ce
			}
			return fmt.Errorf("ring: %v seq %d: recv from %s (rank %d): %w",
				o.plan.Algo, o.hdr.Seq, peer, x.Peer, err)
		}
		if h.Kind == wire.KindControl && (h.Flags == flagStaleNotice || h.Flags == uint8(AbortBehind)) {
			if h.Epoch > o.hdr.Epoch {
				// A notice, or a marker for the newer epoch (from a newer
				// rank, or from a stale one, which names no rank): this
				// rank is behind too.
				return &StaleEpochError{Peer: peer, Rank: x.Peer, Epoch: o.hdr.Epoch, PeerEpoch: h.Epoch, peerSeq: h.Seq,
					Relayed: h.Flags == uint8(AbortBehind) && h.Step == fromSender}
			}
			if h.Flags == flagStaleNotice {
				continue // an answer to a leftover this rank sent
			}
		}
		if h.Epoch < o.hdr.Epoch {
			o.tellStale(x.Peer)
			continue
		}
		if h.Epoch == o.hdr.Epoch && h.Seq < o.hdr.Seq {
			continue // a leftover of an aborted collective
		}
		if h.Epoch > o.hdr.Epoch {
			return &StaleEpochError{Peer: peer, Rank: x.Peer, Epoch: o.hdr.Epoch, PeerEpoch: h.Epoch, peerSeq: h.Seq}
		}
		// Every earlier message from the peer is now consumed.
		c.dirty[x.Peer] = false
		if h.Kind == wire.KindControl && h.Epoch == o.hdr.Epoch && h.Seq == o.hdr.Seq {
			return o.abortError(x.Peer, h)
		}
		return o.check(x, h, n, err, len(buf))
	}
}

// flagStaleNotice marks the control message that answers a message from
// an older epoch. Abort markers carry an AbortReason in Flags, all below it.
const flagStaleNotice = 0x40

// fromSender, as an abort marker's origin and culprit rank, names the
// rank that sent the marker: a rank in an older epoch does not know its
// rank in the newer view.
const fromSender = ^uint32(0)

// tellStale answers a message from an older epoch, once per peer and
// collective: it may be a leftover of an aborted collective, which the
// peer, if it has moved on too, discards; or the peer was left behind,
// and the notice fails its collective with ErrStaleEpoch at once rather
// than at its deadline. The notice carries this collective's epoch and
// sequence number, so that the stale rank can abort it here in turn
// (see Comm.fail).
func (o *op) tellStale(peer int) {
	c := o.c
	if c.toldStale[peer] == o.hdr.Seq+1 {
		return
	}
	c.toldStale[peer] = o.hdr.Seq + 1
	h := wire.Header{Kind: wire.KindControl, Epoch: o.hdr.Epoch, Seq: o.hdr.Seq, Flags: flagStaleNotice}
	ctx, cancel := context.WithTimeout(o.ctx, abortSendTimeout)
	defer cancel()
	if err := c.t.Send(ctx, c.members[peer], c.cfg.Channel, h, nil); err != nil {
		c.log.Debug().Err(err).Int("peer_rank", peer).Msg("stale-epoch notice not sent")
	}
}

// check compares a received header with what x expects.
func (o *op) check(x *Xfer, h wire.Header, n int, rerr error, want int) error {
	w := &o.hdr
	field, wv, gv := "", uint64(0), uint64(0)
	switch {
	case h.Epoch != w.Epoch:
		field, wv, gv = "epoch", w.Epoch, h.Epoch
	case h.Seq != w.Seq:
		field, wv, gv = "seq", w.Seq, h.Seq
	case h.Kind != wire.KindData:
		field, wv, gv = "kind", uint64(wire.KindData), uint64(h.Kind)
	case h.Algo != w.Algo:
		field, wv, gv = "algo", uint64(w.Algo), uint64(h.Algo)
	case h.DType != w.DType:
		field, wv, gv = "dtype", uint64(w.DType), uint64(h.DType)
	case h.Op != w.Op:
		field, wv, gv = "op", uint64(w.Op), uint64(h.Op)
	case h.Total != w.Total:
		field, wv, gv = "total", w.Total, h.Total
	case h.ChunkSize != w.ChunkSize:
		field, wv, gv = "chunk size", uint64(w.ChunkSize), uint64(h.ChunkSize)
	case h.Step != uint32(x.Step):
		field, wv, gv = "step", uint64(x.Step), uint64(h.Step)
	case h.Chunk != uint32(x.Chunk):
		field, wv, gv = "chunk", uint64(x.Chunk), uint64(h.Chunk)
	case rerr != nil || n != want:
		field, wv, gv = "length", uint64(want), h.Len
	default:
		return nil
	}
	return &MismatchError{Peer: o.c.members[x.Peer], Rank: x.Peer, Field: field, Want: wv, Got: gv}
}

// abortError decodes an abort marker received from rank from.
func (o *op) abortError(from int, h wire.Header) error {
	c := o.c
	name := func(r uint32) transport.PeerID {
		if int(r) < len(c.members) {
			return c.members[r]
		}
		return transport.PeerID(fmt.Sprintf("rank(%d)", r))
	}
	reason := AbortReason(h.Flags)
	if reason >= abortReasonEnd {
		reason = AbortOther
	}
	origin, culprit := h.Step, h.Chunk
	if origin == fromSender {
		origin = uint32(from)
	}
	if culprit == fromSender {
		culprit = uint32(from)
	}
	return &AbortError{From: c.members[from], Origin: name(origin), OriginRank: int(origin),
		Culprit: name(culprit), CulpritRank: int(culprit), Reason: reason}
}

// sender is the second walker's goroutine: the send walker, or the
// receive walker of an inline collective whose send stalled (checkStall).
func (c *Comm) sender() {
	defer c.wg.Done()
	for {
		select {
		case <-c.sendc:
		case <-c.quit:
			return
		}
		o := &c.op
		var err error
		if o.stall.Load() == stallHanded {
			// As run does for the receive walker: the sends end before
			// this goroutine reports.
			if err = o.walkRecvsFrom(int(o.recvFrom.Load())); err != nil {
				c.stopSends(o.sendsDone)
			} else {
				<-o.sendsDone
			}
		} else if err = o.walkSends(); err != nil && err != errStopped {
			// Unblock the receive walker: the collective has failed.
			c.ctx.cancel(errSendFailed)
		}
		o.sendErr = err
		c.sendFin <- struct{}{}
	}
}

// watchdog ends the collective in progress when a member falls silent
// (Config.Liveness), checking every livenessPeriod whether one is under
// way, looks for stalled inline sends every stallCheck (checkStall), and
// reports collectives waiting past Config.StallThreshold (reportStall).
func (c *Comm) watchdog() {
	defer c.wg.Done()
	var ticks, stalls, late <-chan time.Time
	if c.reportsStalls() {
		tick := time.NewTicker(stallReportPeriod(c.cfg.StallThreshold))
		defer tick.Stop()
		late = tick.C
	}
	if c.cfg.Liveness != nil {
		tick := time.NewTicker(c.livenessPeriod())
		defer tick.Stop()
		ticks = tick.C
	}
	if c.sendBuffer > 0 {
		stall := time.NewTicker(stallCheck)
		defer stall.Stop()
		stalls = stall.C
	}
	for {
		select {
		case now := <-ticks:
			gen, active := c.ctx.activeGen()
			if !active {
				continue
			}
			if r := c.silentMember(now); r >= 0 {
				c.ctx.cancelGen(gen, errSilent, func() { c.silent.Store(int32(r)) })
			}
		case <-stalls:
			c.checkStall()
		case now := <-late:
			c.reportStall(now)
		case <-c.quit:
			return
		}
	}
}

// onTimer is the deadline timer's callback: it ends the collective in
// progress once its deadline has passed. It acts only on the collective
// in progress, through its generation, so a callback that runs late,
// after run stopped the timer, finds none, or one whose own deadline it
// checks.
func (c *Comm) onTimer() {
	gen, active := c.ctx.activeGen()
	if !active {
		return
	}
	if left := time.Duration(c.op.deadline.Load()) - time.Since(c.born); left > 0 {
		c.timer.Reset(left)
		return
	}
	c.ctx.cancelGen(gen, errDeadline, func() {})
}

// checkStall hands an inline collective's receives to the second walker
// if the send in flight is the one the previous check saw: it has blocked
// for at least stallCheck.
func (c *Comm) checkStall() {
	o := &c.op
	if o.stall.Load() != stallArmed {
		return
	}
	if seq := o.sendSeq.Load(); o.seenSeq.Swap(seq) == seq && o.stall.CompareAndSwap(stallArmed, stallHanded) {
		select { // the second walker is idle: the collective runs inline
		case c.sendc <- struct{}{}:
		case <-c.quit:
		}
	}
}

// livenessPeriod is how often the watchdog checks the members' liveness:
// four times per PeerTimeout, so a silent member is found within 1.25
// PeerTimeout of its last heartbeat.
func (c *Comm) livenessPeriod() time.Duration {
	return max(c.cfg.PeerTimeout/4, time.Millisecond)
}

// silentMember returns the first member other than this rank that
// Liveness has not heard from for PeerTimeout at now, or -1.
func (c *Comm) silentMember(now time.Time) int {
	for r, m := range c.members {
		if r != c.cfg.Rank && now.Sub(c.cfg.Liveness.LastHeard(m)) > c.cfg.PeerTimeout {
			return r
		}
	}
	return -1
}

// stopGrace is how long a failed collective lets a send in progress finish
// before cancelling it. A send cut off mid-message leaves the stream out of
// step, so the peer would see a broken connection instead of the abort
// marker that follows; a send whose receiver is still reading finishes in
// far less time than this.
const stopGrace = 250 * time.Millisecond

// abortSendTimeout bounds the sending of abort markers.
const abortSendTimeout = time.Second

// run executes plan on data, of dtype elements of es bytes, sent as
// wireType (DTypeBytes: as dtype). c.mu is held and c.op's reduction and
// codec are set.
func (c *Comm) run(ctx context.Context, e *planEntry, dtype wire.DType, wop wire.Op, data []byte, es int, wireType wire.DType) error {
	o := &c.op
	wes := es // bytes per element on the wire
	if o.codec != nil {
		dtype, wes = wireType, wireType.Size()
	}
	if uint64(e.plan.ChunkElems)*uint64(wes) > math.MaxUint32 {
		return invalid("%d-byte messages exceed the header's chunk size", e.plan.ChunkElems*wes)
	}
	c.seq++
	c.started.Store(c.seq)
	hdr := wire.Header{Kind: wire.KindData, Epoch: c.cfg.Epoch, Seq: c.seq, Algo: uint8(e.plan.Algo),
		DType: dtype, Op: wop, Total: uint64(e.plan.Length), ChunkSize: uint32(e.plan.ChunkElems * wes)}
	o.plan, o.data, o.es, o.hdr = &e.plan, data, es, hdr
	if o.codec != nil {
		if len(c.sendScratch) < e.maxSend {
			c.sendScratch = make([]uint16, e.maxSend)
		}
		if len(c.recvScratch) < e.maxRecv {
			c.recvScratch = make([]uint16, e.maxRecv)
		}
		o.sendScratch, o.recvScratch = c.sendScratch, c.recvScratch
		o.image, o.forwards, o.keeps = nil, nil, nil
		if e.forwards != nil && useWireImage {
			if len(c.image) < e.plan.Length {
				c.image = make([]uint16, e.plan.Length)
			}
			o.image, o.forwards, o.keeps = c.image, e.forwards, e.keeps
		}
	} else {
		if need := e.maxRecv * es; len(c.scratch) < need {
			c.scratch = make([]byte, need)
		}
		o.scratch = c.scratch
	}
	o.sent.Store(0)
	o.recvd.Store(0)
	o.stop.Store(false)
	o.sendErr = nil
	o.waiting.Store(-1)
	// Deadlines and the bandwidth estimate count wire bytes: that is what
	// the links carry.
	wireBytes := len(data) / es * wes
	o.timeout = c.cfg.CollectiveTimeout
	if err := ctx.Err(); err != nil {
		// The collective still takes its sequence number, and the peers
		// learn at once that this rank will not take part, so every rank
		// stays in step for the next one.
		c.fail(o, err)
		return err
	}
	start := time.Now()
	if c.reportsStalls() {
		c.under.set(c.seq, e.plan.Algo, len(data), start)
	}
	// Before begin, so that a timer callback that finds this collective
	// active reads its deadline.
	o.deadline.Store(int64(start.Add(o.timeout).Sub(c.born)))
	c.useView(o, c.ctx.begin(ctx, start.Add(o.timeout)))
	c.timer.Reset(o.timeout)
	inline := c.inline(e, wes)
	o.inline = inline

	sends := len(e.plan.Sends) > 0 && !inline
	if sends {
		c.sendc <- struct{}{}
	}
	// rerr is this goroutine's walk, serr the second walker's: the send
	// walker's, or the receives' once an inline send stalled.
	var rerr, serr error
	if inline {
		var handed bool
		if handed, rerr = o.walkInline(); handed {
			// The second walker took the receives; this goroutine ran
			// the sends. As the send walker would, a failed send ends
			// the receives at once.
			if rerr != nil && rerr != errStopped {
				c.ctx.cancel(errSendFailed)
			}
			o.sendsDone <- struct{}{}
			<-c.sendFin
			rerr, serr = o.sendErr, rerr
			c.handedOff(e, wes)
			sends = false
		}
	} else {
		rerr = o.walkRecvs()
	}
	if sends {
		if rerr != nil {
			c.stopSends(c.sendFin)
		} else {
			<-c.sendFin
		}
		serr = o.sendErr
	}
	o.stall.Store(stallIdle)
	c.ctx.end()
	c.timer.Stop()

	err := rerr
	if err == nil || errors.Is(err, errSendFailed) || errors.Is(err, errStopped) {
		if serr != nil && serr != errStopped {
			err = serr
		}
	}
	c.clean = err == nil
	if err == nil {
		c.observe(wireBytes, time.Since(start))
		return nil
	}
	err = c.translate(err, o)
	c.fail(o, err)
	return err
}

// stopSends ends the sends after the receives failed: they stop before
// the next one, and one in flight gets stopGrace to finish its message,
// so that the peer reads the abort marker that follows rather than a
// broken stream. done yields once the sends have ended.
func (c *Comm) stopSends(done <-chan struct{}) {
	o := &c.op
	o.stop.Store(true)
	wake(o.recvWake)
	grace := time.NewTimer(stopGrace)
	select {
	case <-done:
	case <-grace.C:
		c.ctx.cancel(errStopped)
		<-done
	}
	grace.Stop()
}

// inlineMax caps inline collectives whatever the transport buffers: the
// two walkers overlap a larger plan's sends with its receives, and
// inline sends would serialise them.
const inlineMax = 64 << 10

// inline reports whether plan e, with wes bytes per element on the wire,
// runs on the caller's goroutine (walkInline). What it sends to any one
// peer must fit half the transport's send buffer, since nothing drains it
// until the peer gets to it; the other half is for what may already be
// queued. The collective after a failure, and a new Comm's first, which
// may share the transport with one that failed, keep both walkers: a
// failed collective leaves messages queued until the peer's next receive
// from this rank discards them. Neither rule is a guarantee (a rank that
// returned while a peer failed, or a broadcast root that ran ahead, has
// queued more), so an inline send that blocks hands the receives to the
// second walker within two stallChecks.
func (c *Comm) inline(e *planEntry, wes int) bool {
	if !c.clean || c.sendBuffer == 0 || len(e.plan.Sends) == 0 {
		return false
	}
	return peerBytes(e, wes) <= min(c.sendBuffer/2, inlineMax, c.inlineCap)
}

// peerBytes bounds what plan e, with wes bytes per element on the wire,
// sends to any one peer, frame headers included.
func peerBytes(e *planEntry, wes int) int {
	return e.peerSendElems*wes + e.peerSendMsgs*wire.FrameHeaderSize
}

// handedOff learns from an inline collective whose send stalled: the
// transport buffers less than it said, so plans that send as much no
// longer run inline, and each stall is paid once.
func (c *Comm) handedOff(e *planEntry, wes int) {
	b := peerBytes(e, wes)
	c.inlineCap = b - 1
	c.handoffs++
	c.log.Info().Int("bytes", b).Dur("after", stallCheck).
		Msg("an inline send blocked and its receives moved to a second goroutine; collectives that send this much to a peer no longer run inline")
}

// translate turns the op context's internal causes into the errors callers
// see.
func (c *Comm) translate(err error, o *op) error {
	switch {
	case errors.Is(err, errDeadline):
		t := &TimeoutError{Deadline: o.timeout, Rank: int(o.waiting.Load())}
		if t.Rank >= 0 {
			t.Peer = c.members[t.Rank]
		}
		return fmt.Errorf("ring: %v seq %d: %w", o.plan.Algo, o.hdr.Seq, t)
	case errors.Is(err, errSilent):
		r := int(c.silent.Load())
		return fmt.Errorf("ring: %v seq %d: rank %d: %w", o.plan.Algo, o.hdr.Seq, r,
			&transport.PeerError{Peer: c.members[r], Op: "heartbeat", Err: ErrPeerSilent})
	case errors.Is(err, ErrClosed):
		return ErrClosed
	case errors.Is(err, errStopped), errors.Is(err, errSendFailed):
		// Unreachable: a stop or a send failure always comes with its cause.
		return fmt.Errorf("ring: %v seq %d: %w", o.plan.Algo, o.hdr.Seq, ErrAborted)
	}
	return err
}

// fail marks every peer as possibly holding leftovers and tells every other
// member that the collective failed.
//
// The marker goes to all members, not only to those this plan sends to:
// ranks that disagree about the collective run different plans (lengths
// on either side of SmallBytes give different algorithms), and a rank may
// be waiting for a message from this one that this rank's plan never
// sends. Every rank still waiting is waiting for some peer; the chain of
// waits ends at a rank that failed and so told it, or told a rank that
// then failed and told it. That costs n-1 markers per failed rank, only on
// failure. A member this rank never connected to is skipped (Send fails
// with ErrNotConnected), so connecting to all members makes aborts reach
// furthest. So is a culprit known to be gone, and the markers go out
// concurrently: a stopped peer's full buffers would otherwise hold back
// the markers to the live ones until abortSendTimeout.
func (c *Comm) fail(o *op, err error) {
	c.clean = false
	for i := range c.dirty {
		c.dirty[i] = true
	}
	h := o.hdr
	h.Kind = wire.KindControl
	skip := -1
	gone := -1 // a culprit that is dead or silent: a marker to it would only block
	var ae *AbortError
	if errors.As(err, &ae) {
		h.Flags = uint8(ae.Reason)
		h.Step, h.Chunk = uint32(c.rankOf(ae.Origin)), uint32(c.rankOf(ae.Culprit))
		skip = c.rankOf(ae.From)
		if ae.Reason == AbortPeerGone {
			gone = c.rankOf(ae.Culprit)
		}
		c.log.Debug().Err(err).Uint64("seq", h.Seq).Msg("collective aborted by a peer")
	} else {
		culprit := c.cfg.Rank
		var me *MismatchError
		var se *StaleEpochError
		var te *TimeoutError
		switch {
		case errors.As(err, &me):
			culprit = me.Rank
		case errors.As(err, &se):
			culprit = se.Rank
		case errors.As(err, &te) && te.Peer != "":
			culprit = c.rankOf(te.Peer)
		default:
			if p, ok := transport.PeerOf(err); ok {
				culprit = c.rankOf(p)
			}
		}
		if culprit < 0 {
			culprit = c.cfg.Rank
		}
		h.Flags = uint8(reasonOf(err))
		h.Step, h.Chunk = uint32(c.cfg.Rank), uint32(culprit)
		if errors.Is(err, transport.ErrPeerGone) && culprit != c.cfg.Rank {
			gone = culprit
		}
		c.log.Warn().Err(err).Uint64("seq", h.Seq).Msg("collective failed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), abortSendTimeout)
	defer cancel()
	skipped := make([]bool, len(c.members))
	skipped[c.cfg.Rank] = true
	for _, r := range []int{skip, gone} {
		if r >= 0 {
			skipped[r] = true
		}
	}
	// Concurrently: a peer whose connection is stuck (its process stopped,
	// its buffers full) must not hold back the markers to the others.
	var wg sync.WaitGroup
	// A rank found stale also aborts the newer epoch's collective, whose
	// ranks discard markers from its own epoch: a stale-epoch notice or a
	// newer message named that collective. Its ranks run in step, so every
	// member gets the marker, not only the one that named it.
	var behind *wire.Header
	if se := (*StaleEpochError)(nil); ae == nil && errors.As(err, &se) {
		behind = &wire.Header{Kind: wire.KindControl, Epoch: se.PeerEpoch, Seq: se.peerSeq, Flags: uint8(AbortBehind),
			Step: fromSender, Chunk: fromSender}
	}
	for r := range c.members {
		if skipped[r] {
			continue
		}
		wg.Go(func() {
			// The newer epoch's marker first: a stale peer that reads it
			// learns that epoch and passes the marker on in turn.
			for _, m := range []*wire.Header{behind, &h} {
				if m == nil {
					continue
				}
				if serr := c.t.Send(ctx, c.members[r], c.cfg.Channel, *m, nil); serr != nil {
					c.log.Debug().Err(serr).Str("peer", string(c.members[r])).Msg("abort marker not sent")
					return
				}
			}
		})
	}
	wg.Wait()
}

// rankOf returns the rank of peer, or -1.
func (c *Comm) rankOf(peer transport.PeerID) int {
	for i, m := range c.members {
		if m == peer {
			return i
		}
	}
	return -1
}

// Bandwidth returns the measured throughput estimate, in bytes per second,
// that a Comm replacing this one passes on as Config.InitialBandwidth.
func (c *Comm) Bandwidth() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bw
}

// observe folds a successful collective's throughput into the bandwidth
// estimate. Small collectives are latency-bound and say little about
// bandwidth, so they are left out.
func (c *Comm) observe(n int, d time.Duration) {
	if n < minObservedBytes || d <= 0 {
		return
	}
	bw := float64(n) / d.Seconds()
	c.bw = max(0.75*c.bw+0.25*bw, minBandwidth)
}

const (
	initialBandwidth = 100e6 // bytes per second, before any measurement
	minBandwidth     = 10e6
	minObservedBytes = 256 << 10
)
