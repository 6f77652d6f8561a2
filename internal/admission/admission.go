// Package admission runs the admission handshake, both sides: a pending
// joiner and every member prove that each reaches the other and that
// the joiner fits the job (its settings and state layout), before any
// member lists the joiner in its boundary record.
package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/state"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// The admission handshake (docs/membership.md, "Admission"): before a
// member lists a pending joiner in its boundary record, it has dialled the
// joiner, heard the joiner's request on a connection the joiner dialled,
// found that the joiner fits the job, and answered. Both sides run it on
// transport.ChanJoin, off the trainer's goroutine, so that no handshake
// holds up an iteration. The member's decision is joinerLink's pure state;
// Admissions and Handshakes do the I/O around it.

// Messages on ChanJoin, told apart by the header's Flags.
const (
	flagJoinRequest = 1
	flagJoinReply   = 2
)

// Version is the version of the handshake's messages.
const Version = 1

const (
	// maxJoinRequest bounds a request: a Fitting of maxDescribed entries
	// with names of maxDescName bytes fits with room to spare.
	maxJoinRequest = 512 << 10
	// maxJoinReply bounds a reply, which names at most one difference.
	maxJoinReply = 16 << 10
	// joinResend is how often a joiner sends its request again until the
	// member accepts it, and how long a member waits for a request before
	// it asks for one (Resend).
	joinResend = 2 * time.Second
	// redialEvery paces dials that failed and receives that broke.
	redialEvery = 500 * time.Millisecond
	// dialAttempt bounds one dial, or one send, of the handshake.
	dialAttempt = 2 * time.Second
)

// Poll is how often the members look at gossip for pending joiners, and
// how often a joiner does for the members.
const Poll = 100 * time.Millisecond

// DefaultNote is how often a handshake that is stuck is logged, on both
// sides. Tests shorten it per worker.
const DefaultNote = 10 * time.Second

// Request is what a joiner sends each member: where it is and what it
// must share with the job.
type Request struct {
	Version int
	Addr    string
	Fit     Fitting
}

// reply is a member's answer: accepted, or why not. Resend asks for
// the request instead: a member whose handshake began afresh has not
// heard it.
type reply struct {
	Version  int
	Accepted bool
	Misfit   *Misfit
	Resend   bool
}

// sendJoin sends v as a handshake message with flag to peer.
func sendJoin(ctx context.Context, t transport.Transport, peer transport.PeerID, flag uint8, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.Send(ctx, peer, transport.ChanJoin, wire.Header{Kind: wire.KindControl, Flags: flag}, b)
}

// recvJoin reads the next handshake message from peer into buf and
// decodes it into v, which must be the message flag says: else a
// *badMessageError.
func recvJoin(ctx context.Context, t transport.Transport, peer transport.PeerID, buf []byte, flag uint8, v any) error {
	h, n, err := t.Recv(ctx, peer, transport.ChanJoin, buf)
	switch {
	case err != nil:
		return err
	case h.Kind != wire.KindControl || h.Flags != flag:
		return &badMessageError{fmt.Errorf("a %v message with flags %d where %d was due", h.Kind, h.Flags, flag)}
	}
	if err := json.Unmarshal(buf[:n], v); err != nil {
		return &badMessageError{err}
	}
	return nil
}

// badMessageError is a handshake message that arrived whole but could not
// be read: the channel is still in step.
type badMessageError struct{ err error }

func (e *badMessageError) Error() string { return e.err.Error() }

// joinerLink is a member's record of its handshake with one pending
// joiner. Its methods are the handshake's events, and listable is the
// decision: the joiner goes into this member's boundary record only
// while both directions have worked and it fits. It is pure: no I/O.
type joinerLink struct {
	addr string
	// dialled: this member's Connect to addr succeeded, and no send on the
	// link has failed since.
	dialled bool
	// heard: a request arrived on a connection the joiner dialled, and no
	// receive from it has failed since.
	heard bool
	// refusal is the difference the last request showed (nil: it fits).
	refusal *Misfit
	// answered: an answer to the joiner's requests went out since it was
	// last heard afresh; owed: a request heard since has no answer yet.
	answered, owed bool
	// lastErr is the last dial, send or receive failure, until the next
	// dial that succeeds.
	lastErr error
	// since is when this member first saw the joiner pending; noted when
	// it last logged the handshake; nudged when it last asked for the
	// request.
	since, noted, nudged time.Time
}

func (l *joinerLink) onDial(err error) {
	l.dialled, l.lastErr = err == nil, err
	if err != nil {
		l.answered = false
	}
}

// nudgeDue says the member should ask for the request: it can send, and
// has heard nothing for joinResend since the handshake began or it last
// asked.
func (l *joinerLink) nudgeDue(now time.Time) bool {
	last := l.since
	if l.nudged.After(last) {
		last = l.nudged
	}
	return l.dialled && !l.heard && now.Sub(last) >= joinResend
}

// onNudge records a request for the request; a failed send has dropped
// the link.
func (l *joinerLink) onNudge(now time.Time, err error) {
	l.nudged = now
	if err != nil {
		l.dialled, l.answered, l.lastErr = false, false, err
	}
}

// onRequest records a request and what it showed. Every request is
// answered (the last answer may have been lost with a connection), but
// only one that changes the verdict makes the joiner wait for it.
func (l *joinerLink) onRequest(m *Misfit) {
	if l.heard && (m == nil) != (l.refusal == nil) {
		l.answered = false
	}
	l.heard, l.refusal, l.owed = true, m, true
}

// onAnswer records the answer's send; a failed send has dropped the link.
func (l *joinerLink) onAnswer(err error) {
	if err != nil {
		l.dialled, l.answered, l.lastErr = false, false, err
		return
	}
	l.answered, l.owed = true, false
}

// onRecvBroken records a broken receive: the joiner's direction must be
// proven again.
func (l *joinerLink) onRecvBroken(err error) {
	l.heard, l.answered, l.owed, l.lastErr = false, false, false, err
}

// owesAnswer says an answer is due and can go out.
func (l *joinerLink) owesAnswer() bool { return l.owed && l.dialled }

func (l *joinerLink) listable() bool { return l.dialled && l.heard && l.refusal == nil && l.answered }

// missing says why the joiner is not listable, for the log.
func (l *joinerLink) missing() string {
	switch {
	case !l.dialled && l.lastErr != nil:
		return fmt.Sprintf("this worker cannot reach its data address %s: %v", l.addr, l.lastErr)
	case !l.dialled:
		return fmt.Sprintf("this worker is still dialling its data address %s", l.addr)
	case !l.heard:
		return "it has sent no admission request over a connection of its own: it cannot reach this worker, or its gossip has not seen this worker yet"
	case l.refusal != nil:
		return "it does not fit the job: " + l.refusal.member()
	case l.lastErr != nil:
		return fmt.Sprintf("this worker's answer did not go out: %v", l.lastErr)
	}
	return "this worker's answer is on its way"
}

// member phrases a Misfit as a member logs it.
func (m *Misfit) member() string {
	return fmt.Sprintf("%s is %s on the joiner, %s in the job", m.What, m.Joiner, m.Job)
}

// joiner phrases a Misfit as the refused joiner reports it.
func (m *Misfit) joiner() string {
	return fmt.Sprintf("%s is %s here, %s in the job", m.What, m.Joiner, m.Job)
}

// Gossip is what the members' side needs of gossip: it only finds the
// joiners, and explains those that went.
type Gossip interface {
	// Workers returns the job's live workers, with the epoch each lists
	// (0: pending).
	Workers() []Worker
	// Dead reports whether gossip declared id dead, and at which gossip
	// address it knew it.
	Dead(id transport.PeerID) (gossipAddr string, dead bool)
}

// Worker is a worker of the job as gossip lists it.
type Worker struct {
	vote.Member
	Epoch uint64
	// Started says its job has run iteration 0 (membership.Meta); Lead
	// and Commit are what its view publishes for the merge of started
	// views.
	Started bool
	Lead    string
	Commit  int64
}

// Admissions is a member's side of the handshake: it watches gossip for
// pending joiners and runs a handshake with each, in goroutines of its
// own. Its methods are safe for concurrent use.
type Admissions struct {
	t    transport.Transport
	g    Gossip
	self transport.PeerID
	fit  Fitting
	log  zerolog.Logger
	note time.Duration // how often a stuck handshake is logged

	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu      sync.Mutex
	members map[transport.PeerID]bool // the current view: not joiners
	// former holds the workers gossip lists that a view since Start has
	// held: one pending again was admitted once, and its death is no
	// sign of a wrong address.
	former map[transport.PeerID]bool
	links  map[transport.PeerID]*joinerHandshake
	// ending holds handshakes stopped but maybe not yet ended, so that the
	// next one with the same joiner waits for them: one receive at a time
	// per peer and channel.
	ending map[transport.PeerID]*joinerHandshake
}

// joinerHandshake is the goroutine of one joinerLink.
type joinerHandshake struct {
	link   joinerLink // guarded by Admissions.mu
	cancel context.CancelFunc
	done   chan struct{}
}

// Start starts the members' side of the handshake, for a worker in a
// view of members that fits fit. A stuck handshake is logged every note.
func Start(t transport.Transport, g Gossip, self transport.PeerID, fit Fitting,
	members []vote.Member, note time.Duration, log zerolog.Logger) *Admissions {
	a := &Admissions{t: t, g: g, self: self, fit: fit, log: log, note: note,
		members: map[transport.PeerID]bool{}, former: map[transport.PeerID]bool{}, links: map[transport.PeerID]*joinerHandshake{},
		ending: map[transport.PeerID]*joinerHandshake{}}
	for _, m := range members {
		a.members[m.ID] = true
		a.former[m.ID] = true
	}
	a.ctx, a.stop = context.WithCancel(context.Background())
	a.wg.Add(1)
	go a.run()
	return a
}

// SetView tells the handshake who is a member: not a joiner. It ends the
// handshakes with joiners that are now members and waits for them, so
// that none touches a member's links after it was admitted.
func (a *Admissions) SetView(members []vote.Member) {
	if a == nil {
		return
	}
	a.mu.Lock()
	clear(a.members)
	var ended []*joinerHandshake
	for _, m := range members {
		a.members[m.ID] = true
		a.former[m.ID] = true
		if h := a.links[m.ID]; h != nil {
			ended = append(ended, a.stopLocked(m.ID, h))
		}
	}
	a.mu.Unlock()
	for _, h := range ended {
		<-h.done
	}
}

// Reset ends the handshake with id, if any, so that the next look at
// gossip begins it afresh: the transport forgot id, and what the
// handshake proved went with it.
func (a *Admissions) Reset(id transport.PeerID) {
	if a == nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if h := a.links[id]; h != nil {
		a.stopLocked(id, h)
	}
}

// stopLocked stops h, the handshake with id, and returns it.
func (a *Admissions) stopLocked(id transport.PeerID, h *joinerHandshake) *joinerHandshake {
	h.cancel()
	delete(a.links, id)
	a.ending[id] = h
	return h
}

// Ready returns the joiners this member may list: those whose handshake
// is listable and whom gossip listed pending at its last look.
func (a *Admissions) Ready() []vote.Member {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []vote.Member
	for id, h := range a.links {
		if h.link.listable() {
			out = append(out, vote.Member{ID: id, Addr: h.link.addr})
		}
	}
	slices.SortFunc(out, vote.CompareMembers)
	return out
}

// Joiners returns the pending joiners this member has a handshake with,
// or had one with that may still be ending.
func (a *Admissions) Joiners() []transport.PeerID {
	if a == nil {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]transport.PeerID, 0, len(a.links)+len(a.ending))
	for id := range a.links {
		out = append(out, id)
	}
	for id := range a.ending {
		if a.links[id] == nil {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// Close stops every handshake and waits for them.
func (a *Admissions) Close() {
	if a == nil {
		return
	}
	a.stop()
	a.wg.Wait()
}

// run looks at gossip every Poll until close.
func (a *Admissions) run() {
	defer a.wg.Done()
	tick := time.NewTicker(Poll)
	defer tick.Stop()
	for {
		a.poll(time.Now())
		select {
		case <-tick.C:
		case <-a.ctx.Done():
			return // every handshake's context ends with a.ctx
		}
	}
}

// poll starts a handshake with every joiner gossip lists pending, stops
// those of joiners it no longer lists there (forgetting them in the
// transport), and logs the handshakes that are stuck.
func (a *Admissions) poll(now time.Time) {
	live, pending := map[transport.PeerID]bool{}, map[transport.PeerID]string{}
	for _, m := range a.g.Workers() {
		live[m.ID] = true
		if m.ID != a.self && m.Epoch == 0 {
			pending[m.ID] = m.Addr
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for id := range pending {
		if a.members[id] {
			delete(pending, id)
		}
	}
	for id, h := range a.links {
		addr, ok := pending[id]
		if ok && addr == h.link.addr {
			continue
		}
		a.stopLocked(id, h)
		// A joiner gone from gossip, or back at another address: the
		// transport's links to it lead nowhere, and a Connect would
		// return them.
		if f, isF := a.t.(transport.Forgetter); isF && !a.members[id] {
			f.Forget(id)
		}
		if !live[id] {
			a.noteGone(id, h.link.addr)
		}
	}
	for id := range a.former {
		if !live[id] && !a.members[id] {
			delete(a.former, id)
		}
	}
	for id, addr := range pending {
		h := a.links[id]
		if h == nil {
			a.startLocked(id, addr, now)
			continue
		}
		if l := &h.link; !l.listable() && now.Sub(l.since) >= a.note && now.Sub(l.noted) >= a.note {
			l.noted = now
			a.log.Warn().Str("joiner", string(id)).Str("addr", addr).Dur("pending_for", now.Sub(l.since).Round(time.Second)).
				Msg("a pending joiner is not admitted: " + l.missing())
		}
	}
}

// noteGone logs a pending joiner that gossip no longer lists live: one
// that left says so, and one declared dead was most often never reachable
// at its gossip address (a wrong --advertise) or stopped, unless a view
// held it once: then it was reachable, and was lost. a.mu is held.
func (a *Admissions) noteGone(id transport.PeerID, addr string) {
	gossipAddr, dead := a.g.Dead(id)
	if dead && a.former[id] {
		a.log.Info().Str("joiner", string(id)).Str("gossip_addr", gossipAddr).Str("addr", addr).
			Msg("gossip declared dead a worker pending again after a view held it: it was lost")
		return
	}
	if dead {
		a.log.Warn().Str("joiner", string(id)).Str("gossip_addr", gossipAddr).Str("addr", addr).
			Msg("gossip declared a pending joiner dead before it was admitted: it stopped, or this worker cannot reach its gossip address (check its --advertise and firewalls)")
		return
	}
	a.log.Info().Str("joiner", string(id)).Msg("a pending joiner left before it was admitted")
}

// startLocked starts the handshake with joiner id at addr, once the last
// one with id, if it is still ending, has ended.
func (a *Admissions) startLocked(id transport.PeerID, addr string, now time.Time) {
	prev := a.ending[id]
	ctx, cancel := context.WithCancel(a.ctx)
	h := &joinerHandshake{link: joinerLink{addr: addr, since: now, noted: now}, cancel: cancel, done: make(chan struct{})}
	a.links[id] = h
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		defer func() {
			a.mu.Lock()
			if a.ending[id] == h {
				delete(a.ending, id)
			}
			a.mu.Unlock()
			close(h.done)
		}()
		if prev != nil {
			<-prev.done
		}
		a.shake(ctx, id, h)
	}()
}

// event applies an event to h's link under the lock and returns a copy of
// the link's state after it.
func (a *Admissions) event(h *joinerHandshake, f func(*joinerLink)) joinerLink {
	a.mu.Lock()
	defer a.mu.Unlock()
	f(&h.link)
	return h.link
}

// shake runs the member's side of the handshake with joiner id until ctx
// ends: dial it, hear its requests, judge them, answer.
func (a *Admissions) shake(ctx context.Context, id transport.PeerID, h *joinerHandshake) {
	requests, wait := listening[Request](ctx, a.t, id, maxJoinRequest, flagJoinRequest)
	defer wait()
	redial := time.NewTicker(redialEvery)
	defer redial.Stop()
	link := a.event(h, func(*joinerLink) {})
	refusalLogged := false
	for {
		if !link.dialled {
			cctx, cancel := context.WithTimeout(ctx, dialAttempt)
			err := a.t.Connect(cctx, id, link.addr)
			cancel()
			if ctx.Err() != nil {
				return
			}
			link = a.event(h, func(l *joinerLink) { l.onDial(err) })
		}
		if link.owesAnswer() {
			reply := reply{Version: Version, Accepted: link.refusal == nil, Misfit: link.refusal}
			sctx, cancel := context.WithTimeout(ctx, dialAttempt)
			err := sendJoin(sctx, a.t, id, flagJoinReply, reply)
			cancel()
			link = a.event(h, func(l *joinerLink) { l.onAnswer(err) })
		}
		select {
		case ev := <-requests:
			m := badRequest(ev.err)
			if ev.err != nil && m == nil {
				// The joiner's streams broke: its sends fail, and it dials
				// again and sends new requests.
				link = a.event(h, func(l *joinerLink) { l.onRecvBroken(ev.err) })
				continue
			}
			if m == nil {
				m = a.judge(ev.msg, link.addr)
			}
			link = a.event(h, func(l *joinerLink) { l.onRequest(m) })
			if m != nil && !refusalLogged {
				refusalLogged = true
				a.log.Warn().Str("joiner", string(id)).Str("addr", link.addr).Str("what", m.What).
					Str("joiner_value", m.Joiner).Str("job_value", m.Job).
					Msg("refused a joiner that does not fit the job: " + m.member())
			}
		case now := <-redial.C:
			if link.nudgeDue(now) {
				sctx, cancel := context.WithTimeout(ctx, dialAttempt)
				err := sendJoin(sctx, a.t, id, flagJoinReply, reply{Version: Version, Resend: true})
				cancel()
				link = a.event(h, func(l *joinerLink) { l.onNudge(now, err) })
			}
		case <-ctx.Done():
			return
		}
	}
}

// judge returns how the request does not fit the job, or nil.
func (a *Admissions) judge(req Request, addr string) *Misfit {
	switch {
	case req.Version != Version:
		return &Misfit{What: "the admission protocol version", Joiner: fmt.Sprint(req.Version), Job: fmt.Sprint(Version)}
	case req.Addr != addr:
		return &Misfit{What: "the data address", Joiner: req.Addr + " (in its request)", Job: addr + " (in its gossip)"}
	}
	return MisfitOf(a.fit, req.Fit)
}

// heard is one handshake message received (msg), or why none was (err).
type heard[M any] struct {
	msg M
	err error
}

// listen receives peer's handshake messages of kind flag (M) on ChanJoin
// until ctx ends, passing each on, and each failure, after which it
// listens again a little later. It is the one receiver of peer's ChanJoin
// messages while it runs.
func listen[M any](ctx context.Context, t transport.Transport, peer transport.PeerID, size int, flag uint8, out chan<- heard[M]) {
	buf := make([]byte, size)
	for {
		var ev heard[M]
		ev.err = recvJoin(ctx, t, peer, buf, flag, &ev.msg)
		if ctx.Err() != nil {
			return
		}
		select {
		case out <- ev:
		case <-ctx.Done():
			return
		}
		if ev.err != nil {
			select {
			case <-time.After(redialEvery):
			case <-ctx.Done():
				return
			}
		}
	}
}

// listening runs listen in a goroutine and returns its channel and a
// function that waits for it to end once ctx has.
func listening[M any](ctx context.Context, t transport.Transport, peer transport.PeerID, size int, flag uint8) (<-chan heard[M], func()) {
	out := make(chan heard[M])
	done := make(chan struct{})
	go func() {
		defer close(done)
		listen(ctx, t, peer, size, flag, out)
	}()
	return out, func() { <-done }
}

// badRequest returns the Misfit of a message that arrived whole but was
// no request this member can read, or nil for other failures.
func badRequest(err error) *Misfit {
	var bad *badMessageError
	switch {
	case errors.Is(err, wire.ErrShortBuffer):
		return &Misfit{What: "its admission request", Joiner: "too long", Job: fmt.Sprintf("at most %d bytes", maxJoinRequest)}
	case errors.As(err, &bad):
		return &Misfit{What: "its admission request", Joiner: "unreadable (" + bad.Error() + ")", Job: fmt.Sprintf("version %d", Version)}
	}
	return nil
}

// handshakes is a pending joiner's side of the handshake: one goroutine
// per member it learns of from gossip, until it is welcomed.
type Handshakes struct {
	t   transport.Transport
	req Request
	log zerolog.Logger

	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup

	mu    sync.Mutex
	links map[transport.PeerID]*memberShake
	// ending holds handshakes stopped but maybe not yet ended, so that the
	// next one with the same member waits for them.
	ending  map[transport.PeerID]*memberShake
	refusal error // the first refusal
}

// memberShake is the joiner's record of its handshake with one member.
type memberShake struct {
	addr     string
	dialled  bool
	accepted bool
	// dialErr is why the last dial failed (nil: it did not); lastErr the
	// last failure to send or receive.
	dialErr, lastErr error
	cancel           context.CancelFunc
	done             chan struct{}
}

func StartHandshakes(t transport.Transport, req Request, log zerolog.Logger) *Handshakes {
	h := &Handshakes{t: t, req: req, log: log, links: map[transport.PeerID]*memberShake{},
		ending: map[transport.PeerID]*memberShake{}}
	h.ctx, h.stop = context.WithCancel(context.Background())
	return h
}

// Retain runs a handshake with every member of ms, and stops those with
// members gossip no longer lists in a view.
func (h *Handshakes) Retain(ms []vote.Member) {
	h.mu.Lock()
	defer h.mu.Unlock()
	want := make(map[transport.PeerID]string, len(ms))
	for _, m := range ms {
		want[m.ID] = m.Addr
	}
	for id, l := range h.links {
		if want[id] != l.addr {
			l.cancel()
			delete(h.links, id)
			h.ending[id] = l
		}
	}
	for id, addr := range want {
		if h.links[id] != nil {
			continue
		}
		prev := h.ending[id]
		ctx, cancel := context.WithCancel(h.ctx)
		l := &memberShake{addr: addr, cancel: cancel, done: make(chan struct{})}
		h.links[id] = l
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			defer func() {
				h.mu.Lock()
				if h.ending[id] == l {
					delete(h.ending, id)
				}
				h.mu.Unlock()
				close(l.done)
			}()
			if prev != nil {
				<-prev.done
			}
			h.shake(ctx, id, l)
		}()
	}
}

// Refused returns the first refusal from a member, or nil.
func (h *Handshakes) Refused() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refusal
}

// Note logs the members that have not accepted this joiner, and why,
// with extra (an explanation from gossip, or "").
func (h *Handshakes) Note(pendingFor time.Duration, extra string) {
	msg, stuck, accepted, known := h.Status()
	msg += extra
	ev := h.log.Info()
	if stuck {
		ev = h.log.Warn()
	}
	ev.Dur("pending_for", pendingFor.Round(time.Second)).Int("accepted_by", accepted).Int("members_known", known).Msg(msg)
}

// Status says why this joiner is still pending; stuck says some member
// has not accepted it.
func (h *Handshakes) Status() (msg string, stuck bool, accepted, known int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var unreachable, silent []string
	for id, l := range h.links {
		switch {
		case l.accepted:
			accepted++
		case l.dialErr != nil:
			unreachable = append(unreachable, fmt.Sprintf("%s at %s (%v)", id, l.addr, l.dialErr))
		case l.lastErr != nil:
			silent = append(silent, fmt.Sprintf("%s at %s (last: %v)", id, l.addr, l.lastErr))
		default:
			silent = append(silent, fmt.Sprintf("%s at %s", id, l.addr))
		}
	}
	slices.Sort(unreachable)
	slices.Sort(silent)
	if len(h.links) == 0 {
		return "still pending: gossip lists no member of the job yet (is the job over?)", true, 0, 0
	}
	return pendingMessage(h.req.Addr, unreachable, silent), len(unreachable)+len(silent) > 0, accepted, len(h.links)
}

// pendingMessage says why a joiner is still pending.
func pendingMessage(self string, unreachable, silent []string) string {
	var parts []string
	if len(unreachable) > 0 {
		parts = append(parts, "this worker cannot reach member(s) "+strings.Join(unreachable, "; "))
	}
	if len(silent) > 0 {
		parts = append(parts, fmt.Sprintf("member(s) %s have not answered its admission request: they cannot reach this worker's data address %s, or its gossip address (check --advertise, --data-addr and firewalls), or their gossip has not seen it yet",
			strings.Join(silent, ", "), self))
	}
	if len(parts) == 0 {
		return "still pending: every member known accepted this worker; a boundary admits it unless the view is at MaxWorkers or the global batch has no sample to spare"
	}
	return "still pending: " + strings.Join(parts, "; ")
}

// Close stops every handshake and waits for them.
func (h *Handshakes) Close() {
	h.stop()
	h.wg.Wait()
}

// shake runs the joiner's side of the handshake with member id until ctx
// ends or the member refuses: dial it and send the request, again every
// joinResend until the member accepts, and after that only when the
// member asks (a handshake of its that began afresh) or its answers
// broke off. Past acceptance it stays quiet, so that nothing it sends can
// fail, and cost links, while the view that admits it forms.
func (h *Handshakes) shake(ctx context.Context, id transport.PeerID, l *memberShake) {
	replies, wait := listening[reply](ctx, h.t, id, maxJoinReply, flagJoinReply)
	defer wait()
	send := time.NewTimer(0)
	defer send.Stop()
	for {
		select {
		case <-send.C:
			if h.isAccepted(l) {
				continue
			}
			next := joinResend
			if err := h.send(ctx, id, l); err != nil {
				next = redialEvery
			}
			send.Reset(next)
		case ev := <-replies:
			h.mu.Lock()
			switch {
			case ev.err != nil || ev.msg.Resend:
				l.accepted, l.lastErr = false, ev.err
				send.Reset(redialEvery)
			case ev.msg.Accepted:
				l.accepted = true
			default:
				m := ev.msg.Misfit
				if m == nil {
					m = &Misfit{What: "something", Joiner: "(unnamed)", Job: "(unnamed)"}
				}
				if h.refusal == nil {
					h.refusal = fmt.Errorf("%w: the job refused this worker (member %s at %s): %s", errs.Diverged, id, l.addr, m.joiner())
				}
				h.mu.Unlock()
				return
			}
			h.mu.Unlock()
		case <-ctx.Done():
			return
		}
	}
}

func (h *Handshakes) isAccepted(l *memberShake) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return l.accepted
}

// send dials member id if need be and sends it the request.
func (h *Handshakes) send(ctx context.Context, id transport.PeerID, l *memberShake) error {
	h.mu.Lock()
	dialled := l.dialled
	h.mu.Unlock()
	var dialErr, err error
	if !dialled {
		cctx, cancel := context.WithTimeout(ctx, dialAttempt)
		dialErr = h.t.Connect(cctx, id, l.addr)
		cancel()
	}
	if dialErr == nil {
		sctx, cancel := context.WithTimeout(ctx, dialAttempt)
		err = sendJoin(sctx, h.t, id, flagJoinRequest, h.req)
		cancel()
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !dialled {
		l.dialErr = dialErr
	}
	l.dialled = dialErr == nil && err == nil
	if err != nil {
		l.lastErr = err
	}
	return errors.Join(dialErr, err)
}

// TensorDesc describes one registered state entry: its name, kind
// ("float32", "float64" or "metadata") and length (0 for metadata).
type TensorDesc struct {
	Name string
	Kind string
	Len  int
}

func (d TensorDesc) String() string {
	if d.Kind == "metadata" {
		return "metadata"
	}
	return fmt.Sprintf("%s[%d]", d.Kind, d.Len)
}

// Bounds on a layout's description in an admission request, so that the
// request of a model with many tensors still fits its buffer. Past them
// the layout digest still tells a difference, if not which entry.
const (
	maxDescribed = 1024
	maxDescName  = 128
)

// Describe lists the first maxDescribed entries of a state's layout,
// with names cut at maxDescName bytes.
func Describe(set *state.Set) []TensorDesc {
	entries := set.Entries()
	out := make([]TensorDesc, 0, min(len(entries), maxDescribed))
	for _, e := range entries[:min(len(entries), maxDescribed)] {
		d := TensorDesc{Name: e.Name, Kind: "metadata"}
		if len(d.Name) > maxDescName {
			d.Name = d.Name[:maxDescName]
		}
		switch e.Kind {
		case state.F32:
			d.Kind, d.Len = "float32", len(e.F32)
		case state.F64:
			d.Kind, d.Len = "float64", len(e.F64)
		}
		out = append(out, d)
	}
	return out
}

// FittingOf is what a worker with settings and set must share with its
// job.
func FittingOf(settings []config.Setting, set *state.Set) Fitting {
	return Fitting{Settings: settings, Tensors: Describe(set), Entries: len(set.Entries()), Layout: set.Layout()}
}

// Fitting is what a worker must share with its job: a joiner sends its
// own in its admission request, and a member compares it with the job's.
type Fitting struct {
	Settings []config.Setting
	// Tensors describe the first entries of the layout; Entries counts
	// them all, and Layout is the digest of the whole layout.
	Tensors []TensorDesc
	Entries int
	Layout  uint64
}

// Misfit is the first difference between a joiner and its job: what
// differs, the joiner's value and the job's.
type Misfit struct {
	What, Joiner, Job string
}

// MisfitOf returns the first difference between the joiner's Fitting and
// the job's, or nil if the joiner fits: settings first, by name, then the
// state layout entry by entry.
func MisfitOf(job, joiner Fitting) *Misfit {
	theirs := make(map[string]string, len(joiner.Settings))
	for _, s := range joiner.Settings {
		theirs[s.Name] = s.Value
	}
	for _, s := range job.Settings {
		v, ok := theirs[s.Name]
		switch {
		case !ok:
			return &Misfit{What: "setting " + s.Name, Joiner: "(not sent)", Job: s.Value}
		case v != s.Value:
			return &Misfit{What: "setting " + s.Name, Joiner: v, Job: s.Value}
		}
	}
	if len(joiner.Settings) != len(job.Settings) {
		return &Misfit{What: "the number of settings", Joiner: strconv.Itoa(len(joiner.Settings)), Job: strconv.Itoa(len(job.Settings))}
	}
	if joiner.Layout == job.Layout && joiner.Entries == job.Entries {
		return nil
	}
	for i := range min(len(job.Tensors), len(joiner.Tensors)) {
		a, b := job.Tensors[i], joiner.Tensors[i]
		switch {
		case a.Name != b.Name:
			return &Misfit{What: fmt.Sprintf("state entry %d", i), Joiner: strconv.Quote(b.Name), Job: strconv.Quote(a.Name)}
		case a != b:
			return &Misfit{What: fmt.Sprintf("state entry %q", a.Name), Joiner: b.String(), Job: a.String()}
		}
	}
	if joiner.Entries != job.Entries {
		return &Misfit{What: "the number of state entries", Joiner: strconv.Itoa(joiner.Entries), Job: strconv.Itoa(job.Entries)}
	}
	return &Misfit{What: fmt.Sprintf("the state layout (past the first %d entries, or in a long name)", len(job.Tensors)),
		Joiner: fmt.Sprintf("digest %016x", joiner.Layout), Job: fmt.Sprintf("digest %016x", job.Layout)}
}
