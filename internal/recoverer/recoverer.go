// Package recoverer feeds a worker's pure recovery.Rank (package
// internal/recovery) and carries out its messages: a receiver and an
// ordered sender per peer on the recovery channel, redials, and the loss
// evidence the heartbeats give. The engine runs the recovery loop and
// acts on what the rank decides.
package recoverer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/recovery"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/transport"
)

// Config is what a recoverer needs of its worker.
type Config struct {
	Self transport.PeerID
	T    transport.Transport
	Live *liveness.Monitor
	// PeerTimeout and CollectiveTimeout are the worker's (gyre.Config).
	PeerTimeout, CollectiveTimeout time.Duration
	// Life ends when the worker closes: every goroutine of the recoverer
	// ends with it.
	Life context.Context
	Log  zerolog.Logger
}

// Recoverer is a gossip worker's side of recovery: the pure rank, which
// lives as long as the worker (it must remember what it accepted), and
// the plumbing of its messages.
type Recoverer struct {
	cfg Config
	// Rank is the pure rank, which the recovery loop steps; between
	// recoveries, Stale reads it.
	Rank *recovery.Rank
	// commitEpoch is the epoch of the view in which the last commit was
	// made.
	commitEpoch uint64

	mu sync.Mutex
	// inbox holds the messages received and not yet stepped.
	inbox   []recovery.Recv
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
	// wake has a token while the inbox is not empty.
	wake chan struct{}
}

// inboxSize bounds the messages buffered while nobody recovers; rounds
// send a few messages per member each.
const inboxSize = 1024

// maxRecoveryMsg bounds one encoded message: a Report carries three
// lists of at most MaxView IDs.
const maxRecoveryMsg = 256 << 10

// recoveryFlag marks recovery messages in the header's Flags.
const recoveryFlag = 0x40

// New returns the recoverer of a worker in view v of members, whose last
// commit is commit.
func New(cfg Config, v recovery.View, commit recovery.Commit, members []vote.Member) *Recoverer {
	rc := &Recoverer{cfg: cfg, wake: make(chan struct{}, 1), formers: map[transport.PeerID]bool{},
		silent: map[transport.PeerID]bool{}, dialing: map[transport.PeerID]bool{},
		addrs: map[transport.PeerID]string{}, hearing: map[transport.PeerID]bool{}, relisten: map[transport.PeerID]time.Time{},
		outboxes: map[transport.PeerID]chan recovery.Msg{}}
	rc.Reset(v, commit, members)
	return rc
}

// Reset starts the rank afresh in view v with commit, as a worker that
// rejoined as a new member does.
func (rc *Recoverer) Reset(v recovery.View, commit recovery.Commit, members []vote.Member) {
	rc.Rank = recovery.NewRank(recovery.ID(rc.cfg.Self), v, commit, recoveryConfig(rc.cfg))
	rc.commitEpoch = commit.Epoch
	rc.Know(members)
}

// ClearInbox drops the messages queued: a worker left out of the job
// reads nothing more of its old view's rounds.
func (rc *Recoverer) ClearInbox() {
	rc.mu.Lock()
	rc.inbox = nil
	rc.mu.Unlock()
}

// Tick is the pure rank's unit of time.
func (rc *Recoverer) Tick() time.Duration { return tick(rc.cfg.PeerTimeout) }

func tick(peerTimeout time.Duration) time.Duration { return max(peerTimeout/20, 5*time.Millisecond) }

// recoveryConfig maps the timeouts onto ticks. A coordinator waits for
// the reports of members it still hears for up to CollectiveTimeout, as
// a collective waits for a late member; a round gives up after that and
// a few peer timeouts more, for its messages. A round's messages go again
// every PeerTimeout, for links that come back.
func recoveryConfig(cfg Config) recovery.Config {
	t := tick(cfg.PeerTimeout)
	collect := int(cfg.CollectiveTimeout/t) + 1
	return recovery.Config{CollectTicks: collect, RoundTicks: collect + int(4*cfg.PeerTimeout/t),
		ResendTicks: max(int(cfg.PeerTimeout/t), 1)}
}

// Know records the members' addresses, for dialling them in a recovery.
func (rc *Recoverer) Know(ms []vote.Member) {
	rc.mu.Lock()
	for _, m := range ms {
		rc.addrs[m.ID] = m.Addr
	}
	rc.mu.Unlock()
}

// Listen runs a receiver for each peer that has none: it reads the
// peer's recovery messages, buffering them until a recovery steps them.
// A receiver whose stream fails ends; a recovery step at least
// PeerTimeout/4 later starts it again.
func (rc *Recoverer) Listen(ids []recovery.ID) {
	now := time.Now()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, id := range ids {
		p := transport.PeerID(id)
		if p == rc.cfg.Self || rc.hearing[p] || now.Before(rc.relisten[p]) {
			continue
		}
		rc.hearing[p] = true
		go func() {
			defer func() {
				rc.mu.Lock()
				delete(rc.hearing, p)
				rc.relisten[p] = time.Now().Add(rc.cfg.PeerTimeout / 4)
				rc.mu.Unlock()
			}()
			buf := make([]byte, maxRecoveryMsg)
			for {
				h, n, err := rc.cfg.T.Recv(rc.cfg.Life, p, transport.ChanRecovery, buf)
				if err != nil {
					if rc.cfg.Life.Err() == nil {
						rc.cfg.Log.Debug().Err(err).Str("peer", string(p)).Msg("recovery receiver stopped")
					}
					return
				}
				if h.Kind != wire.KindControl || h.Flags != recoveryFlag {
					rc.cfg.Log.Warn().Str("peer", string(p)).Msg("ignored a message on the recovery channel that is not one")
					continue
				}
				m, err := recovery.Decode(buf[:n])
				if err != nil {
					rc.cfg.Log.Warn().Err(err).Str("peer", string(p)).Msg("ignored a malformed recovery message")
					continue
				}
				rc.deliver(recovery.Recv{From: id, Msg: m})
			}
		}()
	}
}

// deliver queues a received message for the next step.
func (rc *Recoverer) deliver(m recovery.Recv) {
	rc.mu.Lock()
	if len(rc.inbox) >= inboxSize {
		rc.inbox = rc.inbox[1:] // the oldest is likeliest stale
		rc.cfg.Log.Warn().Msg("recovery inbox full; dropped the oldest message")
	}
	rc.inbox = append(rc.inbox, m)
	rc.mu.Unlock()
	select {
	case rc.wake <- struct{}{}:
	default:
	}
}

// Next takes the oldest queued message, if any.
func (rc *Recoverer) Next() (recovery.Recv, bool) {
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

// AnswerStale answers, between rounds, the calls of ranks that run an
// older view: those a recovery left out learn so, and rejoin. Other
// messages stay queued for the next recovery. It listens to the members
// lost from views, who make such calls.
func (rc *Recoverer) AnswerStale() {
	rc.mu.Lock()
	var keep []recovery.Recv
	var answers []recovery.Send
	for _, m := range rc.inbox {
		if in, ok := rc.Rank.Stale(m.Msg); ok {
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
		rc.Post(a.To, a.Msg)
	}
	rc.Listen(formers)
}

// Answering runs AnswerStale every tick, in the background, until the
// returned stop is called. The rank is not stepped meanwhile, so its
// answers, which read it, do not race with its steps.
func (rc *Recoverer) Answering(every time.Duration) (stop func()) {
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
				rc.AnswerStale()
			case <-done:
				return
			case <-rc.cfg.Life.Done():
				return
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// Drain waits until every posted message has been sent or given up on,
// or for at most limit.
func (rc *Recoverer) Drain(limit time.Duration) {
	for end := time.Now().Add(limit); rc.inflight.Load() > 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

// Post queues m for to. Each peer has one sender, so its messages leave
// in order; a sender gives up on a message after PeerTimeout, and the
// rounds' own timeouts cover what is lost.
func (rc *Recoverer) Post(to recovery.ID, m recovery.Msg) {
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
		rc.cfg.Log.Warn().Str("peer", string(p)).Msg("recovery outbox full; dropped a message")
	}
}

func (rc *Recoverer) sender(p transport.PeerID, q chan recovery.Msg) {
	for {
		var m recovery.Msg
		select {
		case m = <-q:
		case <-rc.cfg.Life.Done():
			return
		}
		rc.send(p, m)
		rc.inflight.Add(-1)
	}
}

// send sends one message to p, dialling it if need be.
func (rc *Recoverer) send(p transport.PeerID, m recovery.Msg) {
	b, err := recovery.Encode(m)
	if err != nil {
		rc.cfg.Log.Error().Err(err).Msg("encoding a recovery message")
		return
	}
	rc.mu.Lock()
	addr := rc.addrs[p]
	rc.mu.Unlock()
	ctx, cancel := context.WithTimeout(rc.cfg.Life, rc.cfg.PeerTimeout)
	defer cancel()
	err = rc.cfg.T.Connect(ctx, p, addr)
	if err == nil {
		err = rc.cfg.T.Send(ctx, p, transport.ChanRecovery, wire.Header{Kind: wire.KindControl, Flags: recoveryFlag}, b)
	}
	if err != nil {
		rc.cfg.Log.Debug().Err(err).Str("peer", string(p)).Msg("a recovery message was not sent")
	}
}

// Redial dials again, in the background, every member whose link is
// down (Connect returns at once for the others). A link whose send failed
// is abandoned until someone dials it (transport.Transport.Send), and the
// heartbeats do not dial: a collective aborted mid-send abandons links to
// members that are alive, whose heartbeats then stop, and after a
// partition heals nothing else dials the other side. This brings the
// heartbeats back, and with them the evidence that the members are there.
func (rc *Recoverer) Redial(ids []recovery.ID) {
	for _, id := range ids {
		p := transport.PeerID(id)
		if p == rc.cfg.Self {
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
			ctx, cancel := context.WithTimeout(rc.cfg.Life, rc.cfg.PeerTimeout)
			err := rc.cfg.T.Connect(ctx, p, addr)
			cancel()
			rc.mu.Lock()
			delete(rc.dialing, p)
			rc.mu.Unlock()
			if err != nil {
				rc.cfg.Log.Debug().Err(err).Str("peer", string(p)).Msg("recovery: a member gone does not answer a dial")
			}
		}()
	}
}

// Evidence steps a Lost for every member of the rank's views that the
// heartbeats say is gone (silent past PeerTimeout, or its connection
// broken), and a Heard for every one they said was gone and now hear
// again. It returns what the steps output.
func (rc *Recoverer) Evidence() []recovery.Output {
	var out []recovery.Output
	now := time.Now()
	inst := rc.Rank.Installed()
	acc, _ := rc.Rank.Accepted()
	for _, v := range []recovery.View{inst, acc} {
		for _, m := range v.Members {
			p := transport.PeerID(m)
			switch {
			case p == rc.cfg.Self:
			case rc.SilentAt(p, now) || rc.late[p]:
				if !rc.silent[p] {
					rc.cfg.Log.Debug().Str("peer", string(p)).Msg("recovery: evidence that a member is gone")
				}
				rc.silent[p] = true
				out = append(out, rc.Rank.Step(recovery.Lost{Peer: m})...)
			case rc.silent[p]:
				rc.cfg.Log.Debug().Str("peer", string(p)).Msg("recovery: a member gone is heard again")
				delete(rc.silent, p)
				out = append(out, rc.Rank.Step(recovery.Heard{Peer: m})...)
			}
		}
	}
	return out
}

// Silent reports whether the heartbeats say p is gone: unheard for longer
// than PeerTimeout, its connection broken, or not watched at all.
func (rc *Recoverer) Silent(p transport.PeerID) bool { return rc.SilentAt(p, time.Now()) }

// SilentAt is Silent at now.
func (rc *Recoverer) SilentAt(p transport.PeerID, now time.Time) bool {
	return Silent(rc.cfg.Live, rc.cfg.PeerTimeout, p, now)
}

// Silent reports whether live's heartbeats say p is gone at now: unheard
// for longer than peerTimeout, its connection broken, or not watched. A
// process that has just resumed from a stall of its own (SIGSTOP, CPU
// starvation; liveness.Monitor.ResumedAt) holds no peer silent for the
// stall (LastHeard counts from the resume), nor for a connection that
// broke before, or within peerTimeout after, the resume: the peer's side
// may have given up on it meanwhile, which says nothing about the peer.
// It holds them silent again once peerTimeout has passed unheard.
func Silent(live *liveness.Monitor, peerTimeout time.Duration, p transport.PeerID, now time.Time) bool {
	heard := live.LastHeard(p)
	if heard.IsZero() || now.Sub(heard) > peerTimeout {
		return true
	}
	brokeAt, broken := live.Broken(p)
	return broken && brokeAt.Sub(live.ResumedAt()) > peerTimeout
}

// Committed records a Commit made in the view of epoch at iteration iter.
// Its digest is left to a recovery, which hashes the commit it restores:
// hashing every commit would cost what the boundary's state check saves.
func (rc *Recoverer) Committed(epoch uint64, iter int64) {
	rc.commitEpoch = epoch
	rc.Rank.Committed(recovery.Commit{Epoch: epoch, Iter: uint64(iter)})
}

// Wake has a token while messages wait for Next.
func (rc *Recoverer) Wake() <-chan struct{} { return rc.wake }

// CommitEpoch is the epoch of the view in which the last commit was made.
func (rc *Recoverer) CommitEpoch() uint64 { return rc.commitEpoch }

// SetCommitEpoch records that the commit a recovery installed was made
// in the view of epoch.
func (rc *Recoverer) SetCommitEpoch(epoch uint64) { rc.commitEpoch = epoch }

// SetLate makes the recovery under way count ids gone, though their
// heartbeats come: a boundary's table found them late past
// CollectiveTimeout. nil clears it.
func (rc *Recoverer) SetLate(ids []transport.PeerID) {
	if ids == nil {
		rc.late = nil
		return
	}
	rc.late = map[transport.PeerID]bool{}
	for _, id := range ids {
		rc.late[id] = true
	}
}

// Addr returns where id was last known, "" if never.
func (rc *Recoverer) Addr(id transport.PeerID) string {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.addrs[id]
}

// Known returns every worker this one knew but itself.
func (rc *Recoverer) Known() []transport.PeerID {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []transport.PeerID
	for id := range rc.addrs {
		if id != rc.cfg.Self {
			out = append(out, id)
		}
	}
	return out
}

// Formers records members a recovery left out: they may call from their
// old view, and AnswerStale listens to them to tell them they are out.
func (rc *Recoverer) Formers(ids []transport.PeerID) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, id := range ids {
		rc.formers[id] = true
	}
}

// LastHeardOf is when the latest heartbeat of the lost members arrived:
// for a killed worker, about when it died. The time since is the whole
// cost of the loss to this worker, detection included. Zero if none of
// them was watched.
func (rc *Recoverer) LastHeardOf(lost []recovery.ID) time.Time {
	var last time.Time
	for _, id := range lost {
		if t := rc.cfg.Live.LastHeard(transport.PeerID(id)); t.After(last) {
			last = t
		}
	}
	return last
}

// NoQuorum is the error of a recovery that found no majority of v's
// voters after waiting quorumTimeout, which began with cause.
func (rc *Recoverer) NoQuorum(v recovery.View, quorumTimeout time.Duration, cause error) error {
	return rc.noQuorum(v, fmt.Sprintf("it waited QuorumTimeout %v (--quorum-timeout)", quorumTimeout), cause)
}

// LeftWithoutQuorum is the error of a recovery that a leave request
// (SIGTERM) ended while this worker heard no majority of v's voters: a
// wait for one would only hold up whoever is stopping the job.
func (rc *Recoverer) LeftWithoutQuorum(v recovery.View, cause error) error {
	return rc.noQuorum(v, "it was asked to leave (SIGTERM) while waiting for one", cause)
}

func (rc *Recoverer) noQuorum(v recovery.View, ended string, cause error) error {
	reach, gone := rc.reach(v, time.Now())
	return fmt.Errorf("%w: this worker reaches %d of the %d voters of the view of epoch %d (%s) and needs %d; "+
		"%s; %s, after: %w",
		errs.NoQuorum, len(reach), len(v.Voters()), v.Epoch, strings.Join(reach, ", "), len(v.Voters())/2+1,
		unheard(gone), ended, cause)
}

// HearsMajority reports whether this worker, itself included, hears a
// majority of v's voters.
func (rc *Recoverer) HearsMajority(v recovery.View) bool {
	reach, _ := rc.reach(v, time.Now())
	return len(reach) > len(v.Voters())/2
}

// reach names v's voters that this worker reaches at now, itself
// included, and those it does not hear.
func (rc *Recoverer) reach(v recovery.View, now time.Time) (reach, gone []string) {
	for _, m := range v.Voters() {
		p := transport.PeerID(m)
		switch {
		case p == rc.cfg.Self:
			reach = append(reach, fmt.Sprintf("rank %d %s (this worker)", v.Rank(m), m))
		case rc.SilentAt(p, now):
			gone = append(gone, fmt.Sprintf("rank %d %s", v.Rank(m), m))
		default:
			reach = append(reach, fmt.Sprintf("rank %d %s", v.Rank(m), m))
		}
	}
	return reach, gone
}

// unheard says which voters a worker without quorum does not hear; if it
// hears them all, that too few answered its recovery rounds.
func unheard(gone []string) string {
	if len(gone) == 0 {
		return "it hears every one of them, but too few answered its recovery rounds (they may have ended, or be in a newer view)"
	}
	return "it does not hear " + strings.Join(gone, ", ")
}

// Watch returns a context that ends, with a lost-peer cause, when the
// heartbeats say a member of the view of epoch (ids, this worker at
// self) other than this worker is gone, or, with ErrMemberLeft, that
// one saw the view fail and left it (liveness.Progress.Left): the steps
// Watch guards have no abort marker to tell them.
func (rc *Recoverer) Watch(ctx context.Context, epoch uint64, ids []transport.PeerID, self int) (context.Context, func()) {
	return Watch(ctx, rc.cfg.Live, rc.cfg.PeerTimeout, epoch, ids, self)
}

// ErrMemberLeft ends a Watch: a member of the view saw it fail and left
// it, to recover or to be admitted again. Like a lost peer, it is a view
// failure that a recovery, or a joiner's return to pending, gets over.
var ErrMemberLeft = errors.New("gyre: a member left the view")

// Watch is Recoverer.Watch for a worker that has no Recoverer yet (one
// joining its first view), on live's heartbeats with peerTimeout.
func Watch(ctx context.Context, live *liveness.Monitor, peerTimeout time.Duration, epoch uint64, ids []transport.PeerID, self int) (context.Context, func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		tick := time.NewTicker(tick(peerTimeout))
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-wctx.Done():
				return
			case now := <-tick.C:
				for r, id := range ids {
					if r == self {
						continue
					}
					if Silent(live, peerTimeout, id, now) {
						cancel(fmt.Errorf("rank %d (%s) of epoch %d fell silent for PeerTimeout %v: %w",
							r, id, epoch, peerTimeout, transport.ErrPeerGone))
						return
					}
					if pr, _, ok := live.Progress(id); ok && pr.Left >= epoch {
						cancel(fmt.Errorf("rank %d (%s) saw the view of epoch %d fail and left it: %w", r, id, pr.Left, ErrMemberLeft))
						return
					}
				}
			}
		}
	}()
	return wctx, func() { close(done); cancel(nil) }
}
