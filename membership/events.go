package membership

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// State is a member's state as this node last saw it.
type State uint8

// States. The zero value is Alive, so a Member built by hand is live.
const (
	Alive   State = iota // answering probes
	Suspect              // missed probes; it has the suspicion timeout to refute
	Dead                 // declared failed: killed, frozen or cut off
	Left                 // left on purpose (Node.Leave)
)

func (s State) String() string {
	switch s {
	case Alive:
		return "alive"
	case Suspect:
		return "suspect"
	case Dead:
		return "dead"
	case Left:
		return "left"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Live reports whether s counts as present: Alive or Suspect.
func (s State) Live() bool { return s == Alive || s == Suspect }

// stateOf maps memberlist's node state onto State.
func stateOf(s memberlist.NodeStateType) State {
	switch s {
	case memberlist.StateSuspect:
		return Suspect
	case memberlist.StateDead:
		return Dead
	case memberlist.StateLeft:
		return Left
	}
	return Alive
}

const (
	// DefaultForget is Config.Forget's default.
	DefaultForget = 10 * time.Minute
	// MaxGone bounds how many dead and left members a node remembers, so
	// that a long job with churn does not grow without limit.
	MaxGone = 256
	// leaveHintTTL is how long a live member's leave notice is believed
	// before memberlist reports it gone: Leave shuts down within its
	// timeout, so an older notice is stale.
	leaveHintTTL = time.Minute
	// seenTTL is how long a notice's nonce is remembered, well past the
	// few gossip rounds a notice lives, so that copies are dropped.
	seenTTL = 2 * time.Minute
)

// record is a member and what this node knows of its leaving.
type record struct {
	Member
	leavingAt time.Time // when it announced a leave; zero if it did not
}

// events keeps this node's own copy of the members. memberlist's Members
// returns pointers into state its goroutines keep changing (a data race to
// read), while its event callbacks run under its lock, so copies made
// there are safe.
//
// memberlist v0.7 reports no suspicion to the callbacks, and reports every
// death, graceful or not, through NotifyLeave with Node.State still alive
// (hashicorp/memberlist#293). So the state is taken from Node.State where
// memberlist sets it (the merge delegate, and NotifyLeave should that be
// fixed), and a graceful leave is also learnt from the leave notice that
// Node.Leave gossips. A member is Dead unless something says it left.
type events struct {
	self   string
	forget time.Duration
	queue  *memberlist.TransmitLimitedQueue // leave notices to gossip
	live   atomic.Int32                     // live members, for the queue

	mu      sync.Mutex
	members map[string]*record
	seen    map[uint64]time.Time // leave notices handled, by nonce
}

func newEvents(self string, forget time.Duration, retransmitMult int) *events {
	e := &events{self: self, forget: forget,
		members: make(map[string]*record), seen: make(map[uint64]time.Time)}
	// NumNodes must not take e.mu: QueueBroadcast may be called under it.
	e.queue = &memberlist.TransmitLimitedQueue{RetransmitMult: retransmitMult,
		NumNodes: func() int { return int(e.live.Load()) }}
	return e
}

// fill copies n's address and metadata into r.
func fill(r *record, n *memberlist.Node) {
	r.Name, r.Addr = n.Name, n.Address()
	var m Meta
	r.MetaErr = m.UnmarshalBinary(n.Meta)
	r.Meta = m
}

// getLocked returns name's record, creating it.
func (e *events) getLocked(name string) *record {
	r := e.members[name]
	if r == nil {
		r = &record{}
		e.members[name] = r
	}
	return r
}

func (e *events) NotifyJoin(n *memberlist.Node) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.getLocked(n.Name)
	fill(r, n)
	r.State, r.Since, r.leavingAt = Alive, now, time.Time{}
	e.countLocked()
}

func (e *events) NotifyUpdate(n *memberlist.Node) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.getLocked(n.Name)
	fill(r, n)
	if !r.State.Live() { // not expected: memberlist reports a return as a join
		r.State, r.Since, r.leavingAt = Alive, now, time.Time{}
	}
	e.countLocked()
}

// NotifyLeave is called for members that died and for members that left.
func (e *events) NotifyLeave(n *memberlist.Node) {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.getLocked(n.Name)
	fill(r, n)
	r.State, r.Since = Dead, now
	if stateOf(n.State) == Left || (!r.leavingAt.IsZero() && now.Sub(r.leavingAt) < leaveHintTTL) {
		r.State = Left
	}
	r.leavingAt = time.Time{}
	if r.Meta.Role == RoleObserver && n.Name != e.self {
		// An observer was never part of the job, and a monitor that runs
		// gyre members every few seconds would crowd the workers out of
		// the history.
		delete(e.members, n.Name)
	}
	e.countLocked()
	e.pruneLocked(now)
}

// NotifyMerge sees the state a node sends when this node joins through it
// or it joins through this node, with each member's state as the sender
// knows it. memberlist merges only the live members it did not know; the
// dead and left ones are kept here, so an observer that joins just after
// a worker went still sees it, and a left member known as dead is
// corrected.
func (e *events) NotifyMerge(peers []*memberlist.Node) error {
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, p := range peers {
		st := stateOf(p.State)
		if p.Name == e.self || st.Live() {
			continue
		}
		r := e.members[p.Name]
		switch {
		case r == nil:
			var m Meta
			if m.UnmarshalBinary(p.Meta) == nil && m.Role == RoleObserver {
				continue // gone observers are not kept; see NotifyLeave
			}
			r = e.getLocked(p.Name)
			fill(r, p)
			r.State, r.Since = st, now
		case st != Left:
		case r.State.Live():
			r.leavingAt = now // memberlist is about to report it gone
		case r.State == Dead && r.Addr == p.Address():
			r.State = Left
		}
	}
	e.pruneLocked(now)
	return nil
}

// countLocked refreshes the live count.
func (e *events) countLocked() {
	n := 0
	for _, r := range e.members {
		if r.State.Live() {
			n++
		}
	}
	e.live.Store(int32(n))
}

// pruneLocked forgets the dead and left members gone for longer than
// e.forget, then the oldest of them past MaxGone, and old notice nonces.
func (e *events) pruneLocked(now time.Time) {
	var gone []*record
	for name, r := range e.members {
		switch {
		case r.State.Live() || name == e.self:
		case now.Sub(r.Since) > e.forget:
			delete(e.members, name)
		default:
			gone = append(gone, r)
		}
	}
	if len(gone) > MaxGone {
		slices.SortFunc(gone, func(a, b *record) int { return a.Since.Compare(b.Since) })
		for _, r := range gone[:len(gone)-MaxGone] {
			delete(e.members, r.Name)
		}
	}
	for nonce, at := range e.seen {
		if now.Sub(at) > seenTTL {
			delete(e.seen, nonce)
		}
	}
}

// list returns copies of the members that keep says to keep.
func (e *events) list(keep func(*Member) bool) []Member {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.pruneLocked(time.Now())
	out := make([]Member, 0, len(e.members))
	for _, r := range e.members {
		if keep(&r.Member) {
			out = append(out, r.Member)
		}
	}
	return out
}

// A leave notice says that the node named Name at gossip address Addr
// leaves. The nonce tells copies apart from a later leave under the same
// name. Encoding: kind, nonce (8 bytes), then name and address, each with
// a uvarint length.
const noticeLeave = 1

// maxNoticeField bounds a decoded name or address.
const maxNoticeField = 1024

func encodeNotice(nonce uint64, name, addr string) []byte {
	b := make([]byte, 0, 1+8+2+len(name)+2+len(addr))
	b = append(b, noticeLeave)
	b = binary.LittleEndian.AppendUint64(b, nonce)
	for _, s := range []string{name, addr} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

func decodeNotice(b []byte) (nonce uint64, name, addr string, ok bool) {
	if len(b) < 9 || b[0] != noticeLeave {
		return 0, "", "", false
	}
	nonce, b = binary.LittleEndian.Uint64(b[1:]), b[9:]
	for _, dst := range []*string{&name, &addr} {
		n, k := binary.Uvarint(b)
		if k <= 0 || n > maxNoticeField || uint64(len(b)-k) < n {
			return 0, "", "", false
		}
		*dst, b = string(b[k:k+int(n)]), b[k+int(n):]
	}
	return nonce, name, addr, len(b) == 0
}

// notice is a leave notice queued for gossip.
type notice []byte

func (b notice) Invalidates(memberlist.Broadcast) bool { return false }
func (b notice) Message() []byte                       { return b }
func (b notice) Finished()                             {}
func (b notice) UniqueBroadcast()                      {}

// announceLeave marks this node as leaving and gossips a notice of it.
// Queued before memberlist's own leave message, it goes out in the same
// gossip packets.
func (e *events) announceLeave() {
	now := time.Now()
	nonce := rand.Uint64()
	e.mu.Lock()
	r := e.getLocked(e.self)
	r.leavingAt = now
	addr := r.Addr
	e.seen[nonce] = now
	e.mu.Unlock()
	e.queue.QueueBroadcast(notice(encodeNotice(nonce, e.self, addr)))
}

// receive handles a gossiped message: a leave notice is applied, then
// passed on once, as memberlist passes on its own messages.
func (e *events) receive(b []byte) {
	nonce, name, addr, ok := decodeNotice(b)
	if !ok {
		return
	}
	now := time.Now()
	e.mu.Lock()
	if _, dup := e.seen[nonce]; dup {
		e.mu.Unlock()
		return
	}
	e.seen[nonce] = now
	if r := e.members[name]; r != nil && r.Addr == addr {
		switch {
		case r.State.Live():
			r.leavingAt = now
		case r.State == Dead: // the notice came after memberlist's message
			r.State = Left
		}
	}
	e.mu.Unlock()
	e.queue.QueueBroadcast(notice(slices.Clone(b)))
}

// delegate serves this node's metadata and leave notices to memberlist.
type delegate struct {
	mu   sync.Mutex
	meta []byte
	ev   *events
}

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil // checked against MaxMeta before it is set
	}
	return d.meta
}

func (d *delegate) NotifyMsg(b []byte) { d.ev.receive(b) }
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.ev.queue.GetBroadcasts(overhead, limit)
}
func (d *delegate) LocalState(join bool) []byte            { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool) {}
