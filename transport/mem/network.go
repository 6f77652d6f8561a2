package mem

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gyre-ml/gyre/transport"
)

// Causes carried by the *transport.PeerError values this package returns.
var (
	// ErrKilled means the peer was crashed by Network.Kill.
	ErrKilled = errors.New("mem: peer killed")
	// ErrPeerClosed means the peer closed its transport. Messages it sent
	// before closing are still delivered first.
	ErrPeerClosed = errors.New("mem: peer closed")
	// ErrDropped means the peer dropped the connection (transport.Dropper).
	ErrDropped = errors.New("mem: connection dropped by peer")
	// ErrNoNode means no live node has joined under the address given to
	// Connect.
	ErrNoNode = errors.New("mem: no node at address")
)

// Link describes the faults on messages from one peer to another. The zero
// Link is a perfect link.
type Link struct {
	// Drop is the probability that a message is silently lost, in [0, 1].
	Drop float64
	// Delay holds every message back by this long before it can be received.
	Delay time.Duration
	// Jitter adds a further random delay, uniform in [0, Jitter). Messages
	// still arrive in order: one never overtakes an earlier, slower one.
	Jitter time.Duration
	// Rate, if not 0, is the link's bandwidth in bytes per second: a
	// message takes its length over Rate to cross, after the messages sent
	// before it on any channel of the link, as on a slow uplink. Small
	// messages cross it at once, so a slow link need not be a distant one.
	Rate float64
}

// Network connects in-process transports and injects faults between them.
// All its methods are safe for concurrent use.
type Network struct {
	seed int64
	pool pool

	// faulty is set while any link fault or partition is in force, so that
	// Send skips the locked fault lookup on a healthy network.
	faulty atomic.Bool

	// mu guards the fields below. It is also held across every change of
	// who is connected to whom (connect, close, kill, drop), so those never
	// interleave. Lock order: Network.mu, then Transport.mu, then
	// session.mu, then pool.mu. Send and Recv hold at most one at a time.
	mu    sync.Mutex
	nodes map[transport.PeerID]*Transport // live transports
	links map[route]Link
	// busy is when each link with a Rate has carried what was sent on it.
	busy  map[route]time.Time
	group map[transport.PeerID]int // partition group per peer; nil when whole
	rngs  map[stream]*rand.Rand
}

type route struct{ from, to transport.PeerID }

type stream struct {
	from, to transport.PeerID
	ch       transport.Channel
}

// NewNetwork returns an empty network whose random faults are drawn from
// seed. Each (sender, receiver, channel) stream has its own source derived
// from seed, so a run replays exactly as long as each stream carries the
// same messages in the same order, however streams interleave.
func NewNetwork(seed int64) *Network {
	return &Network{
		seed:  seed,
		nodes: make(map[transport.PeerID]*Transport),
		links: make(map[route]Link),
		rngs:  make(map[stream]*rand.Rand),
	}
}

// Join adds a node named id and returns its transport, whose Addr is
// string(id). An id may join again once its previous transport was closed
// or killed, like a restarted process; joining under a live id fails. Peers
// keep seeing the old incarnation's failure until either side connects to
// the new one.
func (n *Network) Join(id transport.PeerID) (*Transport, error) {
	if id == "" {
		return nil, errors.New("mem: join with an empty peer id")
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.nodes[id] != nil {
		return nil, fmt.Errorf("mem: peer %s already joined", id)
	}
	t := &Transport{
		net:   n,
		id:    id,
		done:  make(chan struct{}),
		peers: make(map[transport.PeerID]*peer),
	}
	n.nodes[id] = t
	return t, nil
}

// SetLink sets the faults on messages sent from one peer to another (one
// direction only). The zero Link removes them. Drop is clamped to [0, 1]
// and negative durations to 0. Messages already queued are not affected.
func (n *Network) SetLink(from, to transport.PeerID, l Link) {
	l.Drop = min(max(l.Drop, 0), 1)
	l.Delay = max(l.Delay, 0)
	l.Jitter = max(l.Jitter, 0)
	l.Rate = max(l.Rate, 0)
	n.mu.Lock()
	defer n.mu.Unlock()
	if l == (Link{}) {
		delete(n.links, route{from, to})
	} else {
		n.links[route{from, to}] = l
	}
	n.updateFaulty()
}

// Partition splits the network into groups: from then on, every message
// between peers of different groups is silently lost, as in a black hole,
// so receivers wait until their deadline. Peers named in no group form one
// more group together. A new Partition replaces the previous one. Connect
// ignores partitions (connections are assumed to exist before the cut), and
// messages already queued are still delivered.
func (n *Network) Partition(groups ...[]transport.PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.group = make(map[transport.PeerID]int)
	for i, g := range groups {
		for _, id := range g {
			n.group[id] = i + 1
		}
	}
	n.updateFaulty()
}

// Heal removes the partition. Link faults set by SetLink stay.
func (n *Network) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.group = nil
	n.updateFaulty()
}

// Kill crashes the node id, if it is live: its transport is closed (its own
// pending calls return transport.ErrClosed), messages queued to or from it
// are lost, and every peer's pending and future Send and Recv with it fail
// at once with a *transport.PeerError wrapping ErrKilled. The id may join
// again afterwards.
func (n *Network) Kill(id transport.PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.nodes[id]; t != nil {
		n.shutLocked(t, ErrKilled)
	}
}

func (n *Network) updateFaulty() {
	n.faulty.Store(len(n.links) > 0 || n.group != nil)
}

// fate decides whether a message of size bytes on s is lost and, if not,
// how long it is held back. Each stream draws from its own source, so its
// choices depend only on the seed and on how many messages the stream
// carried before, not on how concurrent senders on other streams
// interleave.
func (n *Network) fate(s stream, size int) (lost bool, delay time.Duration) {
	if !n.faulty.Load() {
		return false, 0
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.group != nil && n.group[s.from] != n.group[s.to] {
		return true, 0
	}
	l, ok := n.links[route{s.from, s.to}]
	if !ok {
		return false, 0
	}
	if l.Drop > 0 && n.rng(s).Float64() < l.Drop {
		return true, 0
	}
	delay = l.Delay
	if l.Jitter > 0 {
		delay += time.Duration(n.rng(s).Int64N(int64(l.Jitter)))
	}
	if l.Rate > 0 {
		r, now := route{s.from, s.to}, time.Now()
		start := n.busy[r]
		if start.Before(now) {
			start = now // the link is idle
		}
		done := start.Add(time.Duration(float64(size) / l.Rate * float64(time.Second)))
		if n.busy == nil {
			n.busy = make(map[route]time.Time)
		}
		n.busy[r] = done
		delay += done.Sub(now)
	}
	return false, delay
}

func (n *Network) rng(s stream) *rand.Rand {
	r := n.rngs[s]
	if r == nil {
		// FNV-1a over the stream's identity, as the second PCG seed word.
		h := uint64(14695981039346656037)
		for _, b := range []byte(string(s.from) + "\x00" + string(s.to) + "\x00" + string(rune(s.ch))) {
			h = (h ^ uint64(b)) * 1099511628211
		}
		r = rand.New(rand.NewPCG(uint64(n.seed), h))
		n.rngs[s] = r
	}
	return r
}

// connectLocked gives t a session with the live node at addr, which must be
// peer. It keeps an existing healthy session.
func (n *Network) connectLocked(t *Transport, peer transport.PeerID, addr string) error {
	if t.isClosed() {
		return transport.ErrClosed
	}
	if peer == t.id {
		return fmt.Errorf("mem: %s connect to itself", t.id)
	}
	t.mu.Lock()
	p := t.peerLocked(peer)
	if p.sess != nil && p.sess.healthy() {
		p.connected = true
		t.mu.Unlock()
		return nil
	}
	t.mu.Unlock()
	r := n.nodes[transport.PeerID(addr)]
	if r == nil {
		return &transport.PeerError{Peer: peer, Op: "connect", Err: fmt.Errorf("%w %q", ErrNoNode, addr)}
	}
	if r.id != peer {
		// What a certificate check would catch on a real transport.
		return &transport.PeerError{Peer: peer, Op: "connect",
			Err: fmt.Errorf("%w: node at %q is %s", transport.ErrUnauthenticated, addr, r.id)}
	}
	s := newSession(t, r)
	t.setSession(peer, s, 0, true)
	r.setSession(t.id, s, 1, false)
	return nil
}

// shutLocked closes t. With cause ErrPeerClosed its peers first receive what
// t had already sent; with ErrKilled they fail at once.
func (n *Network) shutLocked(t *Transport, cause error) {
	if t.isClosed() {
		return
	}
	close(t.done)
	if n.nodes[t.id] == t {
		delete(n.nodes, t.id)
	}
	drain := cause == ErrPeerClosed
	t.mu.Lock()
	for _, p := range t.peers {
		if p.sess != nil {
			var causes [2]error
			causes[p.side], causes[1-p.side] = transport.ErrClosed, cause
			var keep [2]bool
			keep[1-p.side] = drain
			p.sess.fail(causes, keep, &n.pool)
		}
	}
	t.mu.Unlock()
	// Peers with no session with t learn now that it is gone, so that a
	// Recv from it, pending or later, fails at once instead of waiting.
	for _, r := range n.nodes {
		r.mu.Lock()
		if p := r.peerLocked(t.id); p.sess == nil {
			p.gone = cause
			p.changed()
		}
		r.mu.Unlock()
	}
}
