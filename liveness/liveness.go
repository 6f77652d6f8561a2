package liveness

import (
	"context"
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// notConnectedRetry is how soon a heartbeat to a peer not connected yet
// is tried again.
const notConnectedRetry = 20 * time.Millisecond

// staleFailure bounds a receive that fails "at once" (peer.brokeAt): one
// that waited longer was reading a live stream when it broke.
const staleFailure = 20 * time.Millisecond

// DefaultInterval is Config.Interval's default: a quarter of the default
// peer timeout of 2 s.
const DefaultInterval = 500 * time.Millisecond

// Config configures a Monitor.
type Config struct {
	// Transport carries the heartbeats, on transport.ChanLiveness. Required.
	Transport transport.Transport
	// Interval is the time between heartbeats to each peer. Set it to a
	// quarter of the peer timeout or less. Default 500 ms.
	Interval time.Duration
	// Logger receives failed heartbeats at debug level. The zero Logger
	// discards.
	Logger zerolog.Logger
	// Progress, if set, is called for every heartbeat sent, which carries
	// its result to the peer (see Monitor.Progress). It must be quick and
	// safe for concurrent use.
	Progress func() Progress
}

// Progress is where a worker stands in its job. Heartbeats carry it, so
// that a worker stalled in a collective can tell which peers have not
// reached it: the ring shows a rank only its neighbours.
type Progress struct {
	Epoch uint64 // the view's epoch
	Iter  int64  // the training iteration
	// Begun counts the collectives the worker has begun in this epoch.
	Begun uint64
	// Left is the epoch of the latest view the worker saw fail and left,
	// to recover or to be admitted again (0: none). The others of that
	// view, still in a step that no collective guards (the link probes,
	// a recovered view's start), end it at once rather than wait out
	// its timeout on a worker that is alive but gone from the view.
	Left uint64
}

// Before reports whether p is behind q: in an earlier epoch, or in the
// same epoch with fewer collectives begun.
func (p Progress) Before(q Progress) bool {
	return p.Epoch < q.Epoch || p.Epoch == q.Epoch && p.Begun < q.Begun
}

// heardProgress is a Progress and when it arrived (unix nanoseconds).
type heardProgress struct {
	Progress
	at int64
}

// progressLen is the size of a heartbeat's payload: Progress, little
// endian. A heartbeat without one (a farewell) carries no progress.
const progressLen = 32

func (p Progress) encode(b *[progressLen]byte) {
	binary.LittleEndian.PutUint64(b[0:], p.Epoch)
	binary.LittleEndian.PutUint64(b[8:], uint64(p.Iter))
	binary.LittleEndian.PutUint64(b[16:], p.Begun)
	binary.LittleEndian.PutUint64(b[24:], p.Left)
}

func decodeProgress(b []byte) Progress {
	return Progress{Epoch: binary.LittleEndian.Uint64(b[0:]), Iter: int64(binary.LittleEndian.Uint64(b[8:])),
		Begun: binary.LittleEndian.Uint64(b[16:]), Left: binary.LittleEndian.Uint64(b[24:])}
}

// Monitor heartbeats with a set of peers and records when each was last
// heard from. Every method is safe for concurrent use.
type Monitor struct {
	t        transport.Transport
	interval time.Duration
	progress func() Progress
	log      zerolog.Logger
	ctx      context.Context // ended by Close
	stop     context.CancelFunc
	wg       sync.WaitGroup

	mu     sync.Mutex
	closed bool
	peers  map[transport.PeerID]*peer

	// stalls records this process's own stalls (see StalledSince).
	stalls stallLog
}

// peer is one watched peer: its two goroutines, when it was last heard,
// and whether it said farewell or its connection ended.
type peer struct {
	heard atomic.Int64 // unix nanoseconds
	bye   atomic.Bool  // a farewell arrived
	gone  atomic.Bool  // receiving from it failed (closed, reset or dropped) since it was last heard
	// brokeAt is when receiving from it first failed since it was last
	// heard from (unix nanoseconds; 0: it has not). A receive that fails
	// at once, from a peer not heard since it was watched, is no break:
	// it found streams that had ended before it began, which a former
	// incarnation of the peer may have left here (a member left out and
	// admitted again closes its old links as it rejoins).
	brokeAt atomic.Int64
	// lostAt is brokeAt for the failures the peer did not cause itself:
	// any but its own close of the connection (transport.ErrClosedByPeer).
	lostAt atomic.Int64
	linked atomic.Bool // heard since it was watched
	// progress is what its latest heartbeat carried, and when; nil
	// before one did.
	progress atomic.Pointer[heardProgress]
	cancel   context.CancelFunc
}

// flagFarewell marks a heartbeat as the sender's farewell (Farewell).
const flagFarewell = 1

// New returns a Monitor watching no peers.
func New(cfg Config) (*Monitor, error) {
	if cfg.Transport == nil {
		return nil, errors.New("liveness: Transport is required")
	}
	if cfg.Interval < 0 {
		return nil, errors.New("liveness: Interval is negative")
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultInterval
	}
	m := &Monitor{t: cfg.Transport, interval: cfg.Interval, progress: cfg.Progress, peers: make(map[transport.PeerID]*peer),
		log: cfg.Logger.With().Str("component", "liveness").Logger()}
	m.ctx, m.stop = context.WithCancel(context.Background())
	m.stalls.limit = 2 * m.interval
	m.stalls.tick(time.Now())
	m.wg.Add(1)
	go m.watchSelf()
	return m, nil
}

// StalledSince reports the longest time since t in which this process
// could not run for more than two heartbeat intervals, so that it sent no
// heartbeats either, or 0. A process stopped (SIGSTOP) or starved of CPU
// stalls; its peers, hearing nothing, may declare it gone, and on resuming
// it finds them silent. A stall still under way counts up to now, as the
// caller may run before the watch does after a resume.
func (m *Monitor) StalledSince(t time.Time) time.Duration { return m.stalls.since(t, time.Now()) }

// watchSelf ticks every interval, and stalls notes each tick.
func (m *Monitor) watchSelf() {
	defer m.wg.Done()
	tick := time.NewTicker(m.interval)
	defer tick.Stop()
	for {
		select {
		case now := <-tick.C:
			m.stalls.tick(now)
		case <-m.ctx.Done():
			return
		}
	}
}

// stallLog keeps the recent gaps between ticks longer than limit: the
// stalls. It is safe for concurrent use.
type stallLog struct {
	limit  time.Duration
	mu     sync.Mutex
	last   time.Time // the latest tick
	recent [maxStalls]stall
	next   int // where the next stall goes in recent
}

// stall is one gap between ticks: when it ended, and how long it was.
type stall struct {
	end time.Time
	d   time.Duration
}

// maxStalls bounds the stalls kept: enough for those of an iteration.
const maxStalls = 8

// tick notes a tick at now, and the gap since the last as a stall if it
// is longer than limit.
func (l *stallLog) tick(now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if gap := now.Sub(l.last); !l.last.IsZero() && gap > l.limit {
		l.recent[l.next] = stall{end: now, d: gap}
		l.next = (l.next + 1) % maxStalls
	}
	l.last = now
}

// resumed returns when the latest stall of at least min ended: now if one
// is under way, the zero Time if none is known.
func (l *stallLog) resumed(now time.Time, min time.Duration) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) >= max(min, l.limit) {
		return now
	}
	var latest time.Time
	for _, s := range l.recent {
		if s.d >= min && s.end.After(latest) {
			latest = s.end
		}
	}
	return latest
}

// since returns the longest stall that ended after t, counting one still
// under way at now.
func (l *stallLog) since(t, now time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var longest time.Duration
	if gap := now.Sub(l.last); gap > l.limit {
		longest = gap
	}
	for _, s := range l.recent {
		if s.end.After(t) && s.d > longest {
			longest = s.d
		}
	}
	return longest
}

// Watch makes peers the watched set: peers not watched before count as
// heard from now and start exchanging heartbeats; peers no longer listed
// stop. It does not block on the network.
func (m *Monitor) Watch(peers []transport.PeerID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	keep := make(map[transport.PeerID]bool, len(peers))
	for _, id := range peers {
		keep[id] = true
		if m.peers[id] != nil {
			continue
		}
		p := &peer{}
		p.heard.Store(time.Now().UnixNano())
		ctx, cancel := context.WithCancel(m.ctx)
		p.cancel = cancel
		m.peers[id] = p
		m.wg.Add(2)
		go m.send(ctx, id)
		go m.receive(ctx, id, p)
	}
	for id, p := range m.peers {
		if !keep[id] {
			p.cancel()
			delete(m.peers, id)
		}
	}
}

// LastHeard returns when peer's last heartbeat arrived, or when watching it
// began if none has; the zero Time for a peer not watched. After a stall
// of this process of 4 heartbeat intervals or more (a peer timeout, as
// gyre sets the interval; StalledSince) it returns the stall's end if
// that is later: a process stopped or starved hears nobody, so its
// peers' silence meanwhile says nothing about them, and on resuming it
// would otherwise find every peer silent before their next heartbeat is
// read. Shorter stalls, common under load, are left out: they would
// postpone the detection of a dead peer. It does not block.
func (m *Monitor) LastHeard(id transport.PeerID) time.Time {
	m.mu.Lock()
	p := m.peers[id]
	m.mu.Unlock()
	if p == nil {
		return time.Time{}
	}
	heard := time.Unix(0, p.heard.Load())
	if r := m.ResumedAt(); r.After(heard) {
		return r
	}
	return heard
}

// ResumedAt returns when this process last resumed from a stall of 4
// heartbeat intervals or more (LastHeard), now if one is under way, or the
// zero Time.
func (m *Monitor) ResumedAt() time.Time { return m.stalls.resumed(time.Now(), 4*m.interval) }

// Progress returns the progress peer's latest heartbeat carried, and when
// it arrived; false if none has, or peer is not watched. It does not
// block.
func (m *Monitor) Progress(id transport.PeerID) (Progress, time.Time, bool) {
	m.mu.Lock()
	p := m.peers[id]
	m.mu.Unlock()
	if p == nil {
		return Progress{}, time.Time{}, false
	}
	if pr := p.progress.Load(); pr != nil {
		return pr.Progress, time.Unix(0, pr.at), true
	}
	return Progress{}, time.Time{}, false
}

// Broken reports when the heartbeat connection from peer broke (closed,
// reset or dropped) without a farewell, if it has since the peer was last
// heard from. For a peer not heard since it was watched, a receive that
// fails at once is no break (the end of an earlier incarnation's
// streams): only its silence (LastHeard) tells it is gone. Of several members whose connections broke within moments,
// the first is usually the one that crashed: the others are survivors
// that gave up on it and closed.
func (m *Monitor) Broken(id transport.PeerID) (time.Time, bool) {
	m.mu.Lock()
	p := m.peers[id]
	m.mu.Unlock()
	if p == nil || p.bye.Load() {
		return time.Time{}, false
	}
	at := p.brokeAt.Load()
	return time.Unix(0, at), at != 0
}

// Lost is Broken for the breaks that a live peer does not cause: it
// reports when the heartbeat connection from peer first failed other than
// by the peer's own close (transport.ErrClosedByPeer: a QUIC FIN, reset
// or application close, a shared-memory stream closed on purpose). A
// crashed process sends none of these; a survivor that gave up on it and
// exited does. A transport that cannot tell them apart (tcp) reports every
// break here.
func (m *Monitor) Lost(id transport.PeerID) (time.Time, bool) {
	m.mu.Lock()
	p := m.peers[id]
	m.mu.Unlock()
	if p == nil || p.bye.Load() {
		return time.Time{}, false
	}
	at := p.lostAt.Load()
	return time.Unix(0, at), at != 0
}

// Farewell is the drain before a job's common end: it tells every watched
// peer that this worker needs nothing more from it, then waits until every
// peer has said the same, or its connection has ended, or it has been
// silent for patience, or ctx ends (then it returns ctx's error). A worker
// that has finished its last collective calls it before closing its
// transport: once every peer has said farewell, none is still waiting for
// a message of this worker's that a close could cut off. Transports hand
// messages to the network without confirming delivery, and QUIC keeps
// unacknowledged data in the process, so without it the last messages of
// a worker that exits at once can be lost.
func (m *Monitor) Farewell(ctx context.Context, patience time.Duration) error {
	m.mu.Lock()
	ids := make([]transport.PeerID, 0, len(m.peers))
	peers := make([]*peer, 0, len(m.peers))
	for id, p := range m.peers {
		ids, peers = append(ids, id), append(peers, p)
	}
	m.mu.Unlock()
	if err := m.Dismiss(ctx, ids); err != nil {
		return err
	}
	tick := time.NewTicker(max(m.interval/4, time.Millisecond))
	defer tick.Stop()
	for {
		done := true
		for _, p := range peers {
			silent := time.Since(time.Unix(0, p.heard.Load())) > patience
			if !p.bye.Load() && !p.gone.Load() && !silent {
				done = false
				break
			}
		}
		if done {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Dismiss tells peers that this worker needs nothing more from them: the
// farewell that a peer waiting in Farewell counts, as when the others of a
// job let a leaving member go. It returns once the farewells are handed
// to the transport (a peer that cannot be reached is skipped), or with
// ctx's error; it does not change the watched set.
func (m *Monitor) Dismiss(ctx context.Context, peers []transport.PeerID) error {
	hdr := wire.Header{Kind: wire.KindControl, Flags: flagFarewell}
	for _, id := range peers {
		if err := m.t.Send(ctx, id, transport.ChanLiveness, hdr, nil); err != nil && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return nil
}

// Close stops every heartbeat and waits for the Monitor's goroutines. It
// does not close the transport, and is idempotent.
func (m *Monitor) Close() error {
	m.mu.Lock()
	m.closed = true
	m.peers = nil
	m.mu.Unlock()
	m.stop()
	m.wg.Wait()
	return nil
}

// send heartbeats to id every interval until ctx ends. A failed send is
// tried again at the next tick: a peer not connected yet, or dropped,
// may be connected again by the caller.
func (m *Monitor) send(ctx context.Context, id transport.PeerID) {
	defer m.wg.Done()
	tick := time.NewTicker(m.interval)
	defer tick.Stop()
	hdr := wire.Header{Kind: wire.KindControl}
	var payload [progressLen]byte
	for {
		hdr.Seq++
		body := payload[:0]
		if m.progress != nil {
			m.progress().encode(&payload)
			body = payload[:]
		}
		// A heartbeat is under 100 bytes; a send that blocks this long is
		// stuck behind a peer that reads nothing at all.
		sctx, cancel := context.WithTimeout(ctx, 4*m.interval)
		err := m.t.Send(sctx, id, transport.ChanLiveness, hdr, body)
		cancel()
		if err != nil && ctx.Err() == nil {
			m.log.Debug().Err(err).Str("peer", string(id)).Msg("heartbeat not sent")
		}
		next := tick.C
		if errors.Is(err, transport.ErrNotConnected) {
			// Watched before its link is up, as a view's members are:
			// the first heartbeat goes as soon as it is, so that the
			// peer's connection can show a crash from the start.
			next = time.After(min(m.interval, notConnectedRetry))
		}
		select {
		case <-next:
		case <-ctx.Done():
			return
		}
	}
}

// receive records id's heartbeats until ctx ends. After a failed receive
// (the peer's connection broke) it waits an interval and listens again, in
// case the peer reconnects.
func (m *Monitor) receive(ctx context.Context, id transport.PeerID, p *peer) {
	defer m.wg.Done()
	var buf [progressLen]byte
	for {
		began := time.Now()
		h, n, err := m.t.Recv(ctx, id, transport.ChanLiveness, buf[:])
		if ctx.Err() != nil || errors.Is(err, transport.ErrClosed) {
			return
		}
		if err == nil || errors.Is(err, wire.ErrShortBuffer) { // any message from the peer proves it alive
			now := time.Now().UnixNano()
			if err == nil && n == progressLen {
				p.progress.Store(&heardProgress{decodeProgress(buf[:]), now})
			}
			p.heard.Store(now)
			p.linked.Store(true)
			p.brokeAt.Store(0)
			p.lostAt.Store(0)
			p.gone.Store(false) // its link came back: Farewell waits for it again
			if h.Flags == flagFarewell {
				p.bye.Store(true)
			}
			continue
		}
		p.gone.Store(true)
		if p.linked.Load() || time.Since(began) >= staleFailure {
			now := time.Now().UnixNano()
			p.brokeAt.CompareAndSwap(0, now)
			if !errors.Is(err, transport.ErrClosedByPeer) {
				p.lostAt.CompareAndSwap(0, now)
			}
		}
		m.log.Debug().Err(err).Str("peer", string(id)).Msg("heartbeat not received")
		select {
		case <-time.After(m.interval):
		case <-ctx.Done():
			return
		}
	}
}
