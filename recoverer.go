package gyre

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// The recoverer: a gossip worker's recovery.Rank and the plumbing that
// feeds it (docs/recovery.md, "As built in the runtime"): a receiver and
// an ordered sender per peer on the recovery channel, redials, and the
// loss evidence the heartbeats give.

// recoverer is a gossip worker's side of recovery: the pure rank, which
// lives as long as the worker (it must remember what it accepted), and
// the plumbing of its messages.
type recoverer struct {
	w    *Worker
	rank *recovery.Rank
	// commitEpoch is the epoch of the view in which the last commit was
	// made.
	commitEpoch uint64

	mu sync.Mutex
	// inbox holds the messages received and not yet stepped; wake has a
	// token while it is not empty.
	inbox   []recovery.Recv
	wake    chan struct{}
	formers map[transport.PeerID]bool   // members lost from a view, who may call from an old one
	addrs   map[transport.PeerID]string // every member this worker knew, for dialling
	hearing map[transport.PeerID]bool   // receivers running
	// relisten is when a receiver that failed may start again: a stream
	// that fails at once must not spin.
	relisten map[transport.PeerID]time.Time
	dialing  map[transport.PeerID]bool // redials under way
	outboxes map[transport.PeerID]chan recovery.Msg
	inflight atomic.Int64 // messages posted and not yet sent or given up on
	// silent are the members the heartbeats said were gone, for telling
	// the rank when they are heard again. Only the recovery loop uses it.
	silent map[transport.PeerID]bool
	// late are the members a boundary's table found late past
	// CollectiveTimeout: the recovery under way counts them gone, though
	// their heartbeats come, so that it leaves them out. Only the
	// recovery loop and Boundary, on the worker's goroutine, use it.
	late map[transport.PeerID]bool
}

// inboxSize bounds the messages buffered while nobody recovers; rounds
// send a few messages per member each.
const inboxSize = 1024

// maxRecoveryMsg bounds one encoded message: a Report carries three
// lists of at most MaxView IDs.
const maxRecoveryMsg = 256 << 10

// recoveryFlag marks recovery messages in the header's Flags.
const recoveryFlag = 0x40

func newRecoverer(w *Worker) *recoverer {
	vs := w.cur
	rc := &recoverer{w: w, commitEpoch: vs.view.Epoch, wake: make(chan struct{}, 1), formers: map[transport.PeerID]bool{},
		silent: map[transport.PeerID]bool{}, dialing: map[transport.PeerID]bool{},
		addrs: map[transport.PeerID]string{}, hearing: map[transport.PeerID]bool{}, relisten: map[transport.PeerID]time.Time{}, outboxes: map[transport.PeerID]chan recovery.Msg{}}
	rc.rank = recovery.NewRank(recovery.ID(w.cfg.Name), vs.recoveryView(), recovery.Commit{Epoch: vs.view.Epoch, Iter: uint64(w.iter)},
		recoveryConfig(w.cfg))
	rc.know(vs.members)
	return rc
}

// recoveryTick is the pure rank's unit of time.
func recoveryTick(cfg Config) time.Duration { return max(cfg.PeerTimeout/20, 5*time.Millisecond) }

// recoveryConfig maps the timeouts onto ticks. A coordinator waits for
// the reports of members it still hears for up to CollectiveTimeout, as
// a collective waits for a late member; a round gives up after that and
// a few peer timeouts more, for its messages. A round's messages go again
// every PeerTimeout, for links that come back.
func recoveryConfig(cfg Config) recovery.Config {
	tick := recoveryTick(cfg)
	collect := int(cfg.CollectiveTimeout/tick) + 1
	return recovery.Config{CollectTicks: collect, RoundTicks: collect + int(4*cfg.PeerTimeout/tick),
		ResendTicks: max(int(cfg.PeerTimeout/tick), 1)}
}

// recoveryView is vs as the recovery protocol sees it.
func (vs *viewState) recoveryView() recovery.View {
	v := recovery.View{Epoch: vs.view.Epoch}
	for _, id := range vs.ids {
		v.Members = append(v.Members, recovery.ID(id))
		if slices.Contains(vs.joiners, id) {
			v.Joiners = append(v.Joiners, recovery.ID(id))
		}
	}
	return v
}

// know records the members' addresses, for dialling them in a recovery.
func (rc *recoverer) know(ms []member) {
	rc.mu.Lock()
	for _, m := range ms {
		rc.addrs[m.ID] = m.Addr
	}
	rc.mu.Unlock()
}

// listen runs a receiver for each peer that has none: it reads the
// peer's recovery messages, buffering them until a recovery steps them.
// A receiver whose stream fails ends; a recovery step at least
// PeerTimeout/4 later starts it again.
func (rc *recoverer) listen(ids []recovery.ID) {
	w := rc.w
	now := time.Now()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, id := range ids {
		p := transport.PeerID(id)
		if p == transport.PeerID(w.cfg.Name) || rc.hearing[p] || now.Before(rc.relisten[p]) {
			continue
		}
		rc.hearing[p] = true
		go func() {
			defer func() {
				rc.mu.Lock()
				delete(rc.hearing, p)
				rc.relisten[p] = time.Now().Add(w.cfg.PeerTimeout / 4)
				rc.mu.Unlock()
			}()
			buf := make([]byte, maxRecoveryMsg)
			for {
				h, n, err := w.t.Recv(w.life, p, transport.ChanRecovery, buf)
				if err != nil {
					if w.life.Err() == nil {
						w.log.Debug().Err(err).Str("peer", string(p)).Msg("recovery receiver stopped")
					}
					return
				}
				if h.Kind != wire.KindControl || h.Flags != recoveryFlag {
					w.log.Warn().Str("peer", string(p)).Msg("ignored a message on the recovery channel that is not one")
					continue
				}
				m, err := recovery.Decode(buf[:n])
				if err != nil {
					w.log.Warn().Err(err).Str("peer", string(p)).Msg("ignored a malformed recovery message")
					continue
				}
				rc.deliver(recovery.Recv{From: id, Msg: m})
			}
		}()
	}
}

// deliver queues a received message for the next step.
func (rc *recoverer) deliver(m recovery.Recv) {
	rc.mu.Lock()
	if len(rc.inbox) >= inboxSize {
		rc.inbox = rc.inbox[1:] // the oldest is likeliest stale
		rc.w.log.Warn().Msg("recovery inbox full; dropped the oldest message")
	}
	rc.inbox = append(rc.inbox, m)
	rc.mu.Unlock()
	select {
	case rc.wake <- struct{}{}:
	default:
	}
}

// next takes the oldest queued message, if any.
func (rc *recoverer) next() (recovery.Recv, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.inbox) == 0 {
		return recovery.Recv{}, false
	}
	m := rc.inbox[0]
	rc.inbox = rc.inbox[1:]
	if len(rc.inbox) > 0 {
		select {
		case rc.wake <- struct{}{}:
		default:
		}
	}
	return m, true
}

// answerStale answers, between rounds, the calls of ranks that run an
// older view: those a recovery left out learn so, and rejoin. Other
// messages stay queued for the next recovery. It listens to the members
// lost from views, who make such calls.
func (rc *recoverer) answerStale() {
	rc.mu.Lock()
	var keep []recovery.Recv
	var answers []recovery.Send
	for _, m := range rc.inbox {
		if in, ok := rc.rank.Stale(m.Msg); ok {
			answers = append(answers, recovery.Send{To: m.From, Msg: in})
			continue
		}
		keep = append(keep, m)
	}
	rc.inbox = keep
	var formers []recovery.ID
	for id := range rc.formers {
		formers = append(formers, recovery.ID(id))
	}
	rc.mu.Unlock()
	for _, a := range answers {
		rc.post(a.To, a.Msg)
	}
	rc.listen(formers)
}

// answering runs answerStale every tick, in the background, until the
// returned stop is called. The rank is not stepped meanwhile, so its
// answers, which read it, do not race with its steps.
func (rc *recoverer) answering(every time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				rc.answerStale()
			case <-done:
				return
			case <-rc.w.life.Done():
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// drain waits until every posted message has been sent or given up on,
// or for at most limit.
func (rc *recoverer) drain(limit time.Duration) {
	for end := time.Now().Add(limit); rc.inflight.Load() > 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// post queues m for to. Each peer has one sender, so its messages leave
// in order; a sender gives up on a message after PeerTimeout, and the
// rounds' own timeouts cover what is lost.
func (rc *recoverer) post(to recovery.ID, m recovery.Msg) {
	w := rc.w
	p := transport.PeerID(to)
	rc.mu.Lock()
	q := rc.outboxes[p]
	if q == nil {
		q = make(chan recovery.Msg, 64)
		rc.outboxes[p] = q
		go rc.sender(p, q)
	}
	rc.mu.Unlock()
	rc.inflight.Add(1)
	select {
	case q <- m:
	default:
		rc.inflight.Add(-1)
		w.log.Warn().Str("peer", string(p)).Msg("recovery outbox full; dropped a message")
	}
}

func (rc *recoverer) sender(p transport.PeerID, q chan recovery.Msg) {
	w := rc.w
	for {
		var m recovery.Msg
		select {
		case m = <-q:
		case <-w.life.Done():
			return
		}
		rc.send(p, m)
		rc.inflight.Add(-1)
	}
}

// send sends one message to p, dialling it if need be.
func (rc *recoverer) send(p transport.PeerID, m recovery.Msg) {
	w := rc.w
	b, err := recovery.Encode(m)
	if err != nil {
		w.log.Error().Err(err).Msg("encoding a recovery message")
		return
	}
	rc.mu.Lock()
	addr := rc.addrs[p]
	rc.mu.Unlock()
	ctx, cancel := context.WithTimeout(w.life, w.cfg.PeerTimeout)
	defer cancel()
	err = w.t.Connect(ctx, p, addr)
	if err == nil {
		err = w.t.Send(ctx, p, transport.ChanRecovery, wire.Header{Kind: wire.KindControl, Flags: recoveryFlag}, b)
	}
	if err != nil {
		w.log.Debug().Err(err).Str("peer", string(p)).Msg("a recovery message was not sent")
	}
}

// redial dials again, in the background, every member whose link is
// down (Connect returns at once for the others). A link whose send failed
// is abandoned until someone dials it (transport.Transport.Send), and the
// heartbeats do not dial: a collective aborted mid-send abandons links to
// members that are alive, whose heartbeats then stop, and after a
// partition heals nothing else dials the other side. This brings the
// heartbeats back, and with them the evidence that the members are there.
func (rc *recoverer) redial(ids []recovery.ID) {
	w := rc.w
	for _, id := range ids {
		p := transport.PeerID(id)
		if p == transport.PeerID(w.cfg.Name) {
			continue
		}
		rc.mu.Lock()
		addr, busy := rc.addrs[p], rc.dialing[p]
		if !busy {
			rc.dialing[p] = true
		}
		rc.mu.Unlock()
		if busy {
			continue
		}
		go func() {
			ctx, cancel := context.WithTimeout(w.life, w.cfg.PeerTimeout)
			err := w.t.Connect(ctx, p, addr)
			cancel()
			rc.mu.Lock()
			delete(rc.dialing, p)
			rc.mu.Unlock()
			if err != nil {
				w.log.Debug().Err(err).Str("peer", string(p)).Msg("recovery: a member gone does not answer a dial")
			}
		}()
	}
}

// evidence steps a Lost for every member of the rank's views that the
// heartbeats say is gone (silent past PeerTimeout, or its connection
// broken), and a Heard for every one they said was gone and now hear
// again. It returns what the steps output.
func (rc *recoverer) evidence() []recovery.Output {
	w := rc.w
	var out []recovery.Output
	now := time.Now()
	inst := rc.rank.Installed()
	acc, _ := rc.rank.Accepted()
	for _, v := range []recovery.View{inst, acc} {
		for _, m := range v.Members {
			p := transport.PeerID(m)
			switch {
			case p == transport.PeerID(w.cfg.Name):
			case w.silentAt(p, now) || rc.late[p]:
				if !rc.silent[p] {
					w.log.Debug().Str("peer", string(p)).Msg("recovery: evidence that a member is gone")
				}
				rc.silent[p] = true
				out = append(out, rc.rank.Step(recovery.Lost{Peer: m})...)
			case rc.silent[p]:
				w.log.Debug().Str("peer", string(p)).Msg("recovery: a member gone is heard again")
				delete(rc.silent, p)
				out = append(out, rc.rank.Step(recovery.Heard{Peer: m})...)
			}
		}
	}
	return out
}

// silent reports whether the heartbeats say p is gone: unheard for longer
// than PeerTimeout, its connection broken, or not watched at all.
func (w *Worker) silent(p transport.PeerID) bool { return w.silentAt(p, time.Now()) }

func (w *Worker) silentAt(p transport.PeerID, now time.Time) bool {
	heard := w.live.LastHeard(p)
	_, broken := w.live.Broken(p)
	return broken || heard.IsZero() || now.Sub(heard) > w.cfg.PeerTimeout
}

// committed records a Commit made in the view of epoch at iteration iter.
// Its digest is left to a recovery, which hashes the commit it restores:
// hashing every commit would cost what the boundary's state check saves.
func (rc *recoverer) committed(epoch uint64, iter int64) {
	rc.commitEpoch = epoch
	rc.rank.Committed(recovery.Commit{Epoch: epoch, Iter: uint64(iter)})
}
