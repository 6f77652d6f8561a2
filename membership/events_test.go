package membership

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

func TestStateString(t *testing.T) {
	for s, want := range map[State]string{Alive: "alive", Suspect: "suspect", Dead: "dead", Left: "left", 9: "state(9)"} {
		if s.String() != want {
			t.Errorf("State(%d).String() = %q, want %q", s, s.String(), want)
		}
	}
	if !Alive.Live() || !Suspect.Live() || Dead.Live() || Left.Live() {
		t.Error("Live: want alive and suspect only")
	}
	var m Member
	if m.State != Alive {
		t.Error("the zero Member is not alive")
	}
}

func TestNoticeRoundTrip(t *testing.T) {
	b := encodeNotice(42, "w1", "127.0.0.1:7946")
	nonce, name, addr, ok := decodeNotice(b)
	if !ok || nonce != 42 || name != "w1" || addr != "127.0.0.1:7946" {
		t.Fatalf("decoded %d %q %q %v", nonce, name, addr, ok)
	}
	for n := range len(b) {
		if _, _, _, ok := decodeNotice(b[:n]); ok {
			t.Fatalf("%d of %d bytes decoded", n, len(b))
		}
	}
	if _, _, _, ok := decodeNotice(append(b, 0)); ok {
		t.Fatal("a trailing byte was accepted")
	}
	b[0] = 7
	if _, _, _, ok := decodeNotice(b); ok {
		t.Fatal("an unknown kind was accepted")
	}
}

// node builds the memberlist.Node the callbacks would get for worker i.
func node(t *testing.T, i int) *memberlist.Node {
	t.Helper()
	meta, err := Meta{DataAddr: fmt.Sprintf("127.0.0.1:%d", 9000+i), Role: RoleWorker, Rank: int32(i)}.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return &memberlist.Node{Name: fmt.Sprintf("w%d", i), Addr: net.IPv4(127, 0, 0, 1), Port: uint16(7000 + i), Meta: meta}
}

func state(e *events, name string) (State, bool) {
	for _, m := range e.list(func(*Member) bool { return true }) {
		if m.Name == name {
			return m.State, true
		}
	}
	return 0, false
}

// TestLeaveNoticeEitherOrder: a member that announced its leave is Left
// whether the notice comes before or after memberlist reports it gone, a
// member with no notice is Dead, and a notice is passed on once.
func TestLeaveNoticeEitherOrder(t *testing.T) {
	e := newEvents("w0", time.Hour, 2)
	for i := range 4 {
		e.NotifyJoin(node(t, i))
	}
	if e.live.Load() != 4 {
		t.Fatalf("live %d, want 4", e.live.Load())
	}
	n1, n2, n3 := node(t, 1), node(t, 2), node(t, 3)
	e.receive(encodeNotice(1, "w1", n1.Address())) // before
	e.NotifyLeave(n1)
	e.NotifyLeave(n2)
	e.receive(encodeNotice(2, "w2", n2.Address()))  // after
	e.receive(encodeNotice(3, "w3", "127.0.0.1:1")) // another instance's
	e.NotifyLeave(n3)
	for name, want := range map[string]State{"w0": Alive, "w1": Left, "w2": Left, "w3": Dead} {
		if got, _ := state(e, name); got != want {
			t.Errorf("%s: %v, want %v", name, got, want)
		}
	}
	if e.live.Load() != 1 {
		t.Errorf("live %d, want 1", e.live.Load())
	}
	queued := e.queue.NumQueued()
	e.receive(encodeNotice(1, "w1", n1.Address()))
	if e.queue.NumQueued() != queued || queued != 3 {
		t.Errorf("queued %d then %d after a copy, want 3 and 3", queued, e.queue.NumQueued())
	}
	// A rejoin makes it alive, and an old notice's copy does not mark it.
	e.NotifyJoin(n1)
	e.receive(encodeNotice(1, "w1", n1.Address()))
	e.NotifyLeave(n1)
	if got, _ := state(e, "w1"); got != Dead {
		t.Errorf("w1 after a rejoin and a crash: %v, want dead", got)
	}
}

// TestMergeKeepsGone: members the join partner reports dead or left are
// kept as such, and a left member known as dead is corrected.
func TestMergeKeepsGone(t *testing.T) {
	e := newEvents("w0", time.Hour, 2)
	e.NotifyJoin(node(t, 0))
	e.NotifyJoin(node(t, 3))
	e.NotifyLeave(node(t, 3))
	peers := []*memberlist.Node{node(t, 0), node(t, 1), node(t, 2), node(t, 3), node(t, 4)}
	peers[0].State = memberlist.StateLeft // this node: ignored
	peers[1].State = memberlist.StateDead
	peers[2].State = memberlist.StateLeft
	peers[3].State = memberlist.StateLeft
	peers[4].State = memberlist.StateAlive // memberlist reports it by NotifyJoin
	if err := e.NotifyMerge(peers); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]State{"w0": Alive, "w1": Dead, "w2": Left, "w3": Left} {
		if got, ok := state(e, name); !ok || got != want {
			t.Errorf("%s: %v (%v), want %v", name, got, ok, want)
		}
	}
	if _, ok := state(e, "w4"); ok {
		t.Error("a live member was added before memberlist reported it")
	}
}

// TestGoneObserversForgotten: an observer (gyre members) that leaves or
// dies is not kept in the history, and one reported gone is not added.
func TestGoneObserversForgotten(t *testing.T) {
	e := newEvents("w0", time.Hour, 2)
	e.NotifyJoin(node(t, 0))
	obs := func(name string) *memberlist.Node {
		meta, _ := Meta{Role: RoleObserver, Rank: -1}.MarshalBinary()
		return &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 7100, Meta: meta}
	}
	e.NotifyJoin(obs("o1"))
	if st, ok := state(e, "o1"); !ok || st != Alive {
		t.Fatalf("a live observer: %v %v", st, ok)
	}
	e.NotifyLeave(obs("o1"))
	gone := obs("o2")
	gone.State = memberlist.StateLeft
	if err := e.NotifyMerge([]*memberlist.Node{gone}); err != nil {
		t.Fatal(err)
	}
	if all := e.list(func(*Member) bool { return true }); len(all) != 1 {
		t.Fatalf("members %+v, want w0 alone", all)
	}
}

// TestHistoryBounded: dead and left members are forgotten after Forget,
// and at most MaxGone are kept, the most recent.
func TestHistoryBounded(t *testing.T) {
	e := newEvents("w0", time.Hour, 2)
	e.NotifyJoin(node(t, 0))
	for i := 1; i <= MaxGone+50; i++ {
		n := node(t, i)
		e.NotifyJoin(n)
		e.NotifyLeave(n)
	}
	all := e.list(func(*Member) bool { return true })
	if len(all) != MaxGone+1 {
		t.Fatalf("%d members kept, want %d", len(all), MaxGone+1)
	}
	if _, ok := state(e, "w1"); ok {
		t.Error("the oldest dead member was kept")
	}
	if _, ok := state(e, fmt.Sprintf("w%d", MaxGone+50)); !ok {
		t.Error("the newest dead member was forgotten")
	}

	e = newEvents("w0", time.Hour, 2)
	e.NotifyJoin(node(t, 0))
	e.NotifyJoin(node(t, 1))
	e.NotifyJoin(node(t, 2))
	e.NotifyLeave(node(t, 2))
	e.mu.Lock()
	e.members["w2"].Since = time.Now().Add(-2 * time.Hour)
	e.members["w0"].Since = time.Now().Add(-2 * time.Hour)
	e.mu.Unlock()
	if all := e.list(func(*Member) bool { return true }); len(all) != 2 {
		t.Fatalf("after Forget: %+v, want w0 and w1", all)
	}
}
