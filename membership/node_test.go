package membership_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/membership"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// TestMain checks that no goroutine outlives the tests. memberlist's
// Shutdown does not wait for a probe in flight, which ends by its own
// timer, up to 8 probe intervals once a node's health score has dropped;
// so the check waits that long before calling what is left a leak.
func TestMain(m *testing.M) {
	code := m.Run()
	if code == 0 {
		err := goleak.Find()
		for deadline := time.Now().Add(10 * time.Second); err != nil && time.Now().Before(deadline); {
			time.Sleep(100 * time.Millisecond)
			err = goleak.Find()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// testLogger logs info and above to the test's log until the test ends,
// then drops: memberlist's goroutines may still log just after Shutdown,
// and a test's log panics once the test has completed.
func testLogger(t *testing.T) zerolog.Logger {
	w := &endingWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return zerolog.New(w).Level(zerolog.InfoLevel)
}

type endingWriter struct {
	t    *testing.T
	mu   sync.Mutex
	done bool
}

func (w *endingWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

func gossipKey(tb testing.TB) []byte {
	s, err := secret.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	return s.GossipKey()
}

// start starts a node named name on a free loopback port with key, logging
// to log (or the test log).
func start(t *testing.T, name string, key []byte, log *transporttest.LogBuffer) *membership.Node {
	t.Helper()
	logger := testLogger(t)
	if log != nil {
		logger = zerolog.New(log)
	}
	n, err := membership.Start(membership.Config{Name: name, Listen: "127.0.0.1:0", Key: key, Local: true,
		Meta:   membership.Meta{DataAddr: "127.0.0.1:9" + name[len(name)-1:], Job: "j", Role: membership.RoleWorker, Rank: -1},
		Logger: logger})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// converged waits until every node lists want live members, and returns
// the members node 0 sees, sorted by name.
func converged(t *testing.T, nodes []*membership.Node, want int) []membership.Member {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for _, n := range nodes {
			ok = ok && len(n.Members()) == want
		}
		if ok {
			ms := nodes[0].Members()
			slices.SortFunc(ms, func(a, b membership.Member) int { return strings.Compare(a.Name, b.Name) })
			return ms
		}
		if time.Now().After(deadline) {
			t.Fatalf("no convergence on %d members", want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestJoinThroughOneSeed: three nodes, the others joining through the
// first, each learn all three with their metadata; a metadata update and a
// leave reach the others.
func TestJoinThroughOneSeed(t *testing.T) {
	key := gossipKey(t)
	nodes := []*membership.Node{start(t, "w0", key, nil), start(t, "w1", key, nil), start(t, "w2", key, nil)}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, n := range nodes[1:] {
		if err := n.Join(ctx, []string{nodes[0].Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	ms := converged(t, nodes, 3)
	for i, m := range ms {
		if m.MetaErr != nil || m.Name != fmt.Sprintf("w%d", i) || m.Meta.DataAddr != fmt.Sprintf("127.0.0.1:9%d", i) ||
			m.Meta.Role != membership.RoleWorker || !strings.HasPrefix(m.Addr, "127.0.0.1:") {
			t.Errorf("member %d: %+v", i, m)
		}
	}
	if err := nodes[2].UpdateMeta(membership.Meta{DataAddr: "127.0.0.1:92", Job: "j", Role: membership.RoleWorker, Epoch: 3, Rank: 2}, time.Second); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ms := nodes[0].Members()
		i := slices.IndexFunc(ms, func(m membership.Member) bool { return m.Name == "w2" })
		if i >= 0 && ms[i].Meta.Epoch == 3 && ms[i].Meta.Rank == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the metadata update never arrived")
		}
	}
	if err := nodes[1].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	converged(t, []*membership.Node{nodes[0], nodes[2]}, 2)
}

// TestWrongKeyCannotJoin: a node with another cluster's key cannot join,
// the cluster keeps its members, and both sides log why.
func TestWrongKeyCannotJoin(t *testing.T) {
	var seedLog, otherLog transporttest.LogBuffer
	seed := start(t, "w0", gossipKey(t), &seedLog)
	other := start(t, "x1", gossipKey(t), &otherLog)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	err := other.Join(ctx, []string{seed.Addr()})
	if err == nil || !strings.Contains(err.Error(), "another cluster secret") {
		t.Fatalf("Join with another key = %v", err)
	}
	if len(seed.Members()) != 1 || len(other.Members()) != 1 {
		t.Fatalf("members after a refused join: %d and %d", len(seed.Members()), len(other.Members()))
	}
	seedLog.Wait(t, "decrypt")
	if s := otherLog.String(); !strings.Contains(s, "decrypt") && !strings.Contains(s, "EOF") {
		t.Logf("joiner's log:\n%s", s)
	}
}

func TestStartRefusesBadConfig(t *testing.T) {
	key := gossipKey(t)
	for _, tc := range []struct {
		cfg  membership.Config
		want string
	}{
		{membership.Config{Listen: "127.0.0.1:0", Key: key}, "Name"},
		{membership.Config{Name: "a", Listen: "127.0.0.1:0"}, "gossip key"},
		{membership.Config{Name: "a", Listen: "0.0.0.0:0", Key: key}, "explicit address"},
		{membership.Config{Name: "a", Listen: "nope", Key: key}, "Listen"},
	} {
		if _, err := membership.Start(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want an error about %s", tc.cfg, err, tc.want)
		}
	}
	if errors.Is(nil, membership.ErrMeta) {
		t.Fatal("unreachable")
	}
}

// startTimed is start with fast failure detection: a node that stops
// answering is dead within a couple of seconds.
func startTimed(t *testing.T, name string, key []byte) *membership.Node {
	t.Helper()
	n, err := membership.Start(membership.Config{Name: name, Listen: "127.0.0.1:0", Key: key, Local: true,
		ProbeInterval: 200 * time.Millisecond, SuspicionMult: 2,
		Meta:   membership.Meta{DataAddr: "127.0.0.1:9" + name[len(name)-1:], Job: "j", Role: membership.RoleWorker, Rank: -1},
		Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// cluster starts the named nodes, joins them through the first and waits
// until all see all.
func cluster(t *testing.T, key []byte, names ...string) []*membership.Node {
	t.Helper()
	var nodes []*membership.Node
	for _, name := range names {
		nodes = append(nodes, startTimed(t, name, key))
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, n := range nodes[1:] {
		if err := n.Join(ctx, []string{nodes[0].Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, nodes, len(nodes))
	return nodes
}

// waitState waits until n's All lists name in state want, and returns
// that member.
func waitState(t *testing.T, n *membership.Node, name string, want membership.State) membership.Member {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		all := n.All()
		if !slices.IsSortedFunc(all, func(a, b membership.Member) int { return strings.Compare(a.Name, b.Name) }) {
			t.Fatalf("All is not sorted by name: %+v", all)
		}
		i := slices.IndexFunc(all, func(m membership.Member) bool { return m.Name == name })
		if i >= 0 && all[i].State == want {
			return all[i]
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never became %v; All: %+v", name, want, all)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestLeaveShowsLeft: a node that leaves is Left in the others' All, with
// its last metadata, and out of their Members; it never shows as dead.
func TestLeaveShowsLeft(t *testing.T) {
	nodes := cluster(t, gossipKey(t), "w0", "w1", "w2")
	addr := nodes[1].Addr()
	if err := nodes[1].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	for _, n := range []*membership.Node{nodes[0], nodes[2]} {
		m := waitState(t, n, "w1", membership.Left)
		if m.Addr != addr || m.Meta.DataAddr != "127.0.0.1:91" || m.Since.IsZero() {
			t.Errorf("left member: %+v", m)
		}
		if got := len(n.All()); got != 3 {
			t.Errorf("All lists %d members, want 3", got)
		}
		if slices.ContainsFunc(n.Members(), func(m membership.Member) bool { return m.Name == "w1" }) {
			t.Error("Members lists the left node")
		}
	}
	// Past the suspicion timeout it is still left, not dead.
	time.Sleep(time.Second)
	for _, n := range []*membership.Node{nodes[0], nodes[2]} {
		waitState(t, n, "w1", membership.Left)
	}
}

// TestCloseShowsDead: a node that stops without leaving is Dead in the
// others' All once the suspicion timeout passes, and out of Members.
func TestCloseShowsDead(t *testing.T) {
	nodes := cluster(t, gossipKey(t), "w0", "w1", "w2")
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes[:2] {
		waitState(t, n, "w2", membership.Dead)
		waitState(t, n, "w1", membership.Alive)
	}
	converged(t, nodes[:2], 2)
}

// TestJoinerSeesGone: a node that joins after one member left and another
// died learns both from its seed, as an observer such as gyre members
// needs.
func TestJoinerSeesGone(t *testing.T) {
	key := gossipKey(t)
	nodes := cluster(t, key, "w0", "w1", "w2")
	if err := nodes[1].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	if err := nodes[2].Close(); err != nil {
		t.Fatal(err)
	}
	waitState(t, nodes[0], "w1", membership.Left)
	waitState(t, nodes[0], "w2", membership.Dead)
	late := startTimed(t, "o3", key)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := late.Join(ctx, []string{nodes[0].Addr()}); err != nil {
		t.Fatal(err)
	}
	waitState(t, late, "w0", membership.Alive)
	waitState(t, late, "w1", membership.Left)
	waitState(t, late, "w2", membership.Dead)
	if got := len(late.Members()); got != 2 {
		t.Errorf("the joiner lists %d live members, want 2", got)
	}
}

// TestGossipPortFlood: a flood of junk on a node's gossip port, TCP
// connections that hold on silent and others that send garbage, plus UDP
// junk, costs a bounded number of served streams, writes a handful of log
// lines, not one per connection, and leaves the node able to take a new
// member.
func TestGossipPortFlood(t *testing.T) {
	key := gossipKey(t)
	log := &transporttest.LogBuffer{}
	seed := start(t, "w0", key, log)
	addr := seed.Addr()
	// Silent connections hold memberlist's stream goroutines until its
	// TCP timeout; past the bound, the rest are closed at once.
	var silent []net.Conn
	for range 200 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
		defer c.Close()
	}
	closedAtOnce := 0
	for _, c := range silent {
		c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if _, err := c.Read(make([]byte, 1)); err == io.EOF {
			closedAtOnce++
		}
	}
	if want := 200 - 64; closedAtOnce < want-8 {
		t.Fatalf("%d of 200 silent connections were closed at once, want about %d: the served streams are not bounded", closedAtOnce, want)
	}
	for _, c := range silent {
		c.Close()
	}
	junk := make([]byte, 512)
	for i := range 1000 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		rand.Read(junk)
		c.Write(junk)
		c.Close()
		if u, err := net.Dial("udp", addr); err == nil {
			u.Write(junk[:64+i%256])
			u.Close()
		}
	}
	// The node still takes a member once the junk it is serving times
	// out (a joiner retries, as gyre.Join does).
	other := start(t, "w1", key, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		err := other.Join(ctx, []string{addr})
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("joining after the flood: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	converged(t, []*membership.Node{seed, other}, 2)
	lines := strings.Count(log.String(), `"level":"warn"`) + strings.Count(log.String(), `"level":"error"`)
	if lines > floodlogTotal+1 {
		t.Fatalf("%d warning lines for a flood of %d connections and packets:\n%s", lines, 2200, log.String())
	}
	if !strings.Contains(log.String(), "gossip") {
		t.Fatalf("the flood left no trace in the log:\n%s", log.String())
	}
}

// floodlogTotal is the flood log's default total of lines per window.
const floodlogTotal = 4

// TestBlockCutsGossip: Config.Block cuts one node off on both sides. Each
// side then holds the other dead; once the cut heals, a Join from the cut
// node (as a worker that rejoins does) brings all three back alive.
func TestBlockCutsGossip(t *testing.T) {
	key := gossipKey(t)
	var cut atomic.Bool
	var addrs [3]atomic.Value // each node's gossip address, once started
	names := []string{"w0", "w1", "w2"}
	nodes := make([]*membership.Node, 3)
	for i, name := range names {
		n, err := membership.Start(membership.Config{Name: name, Listen: "127.0.0.1:0", Key: key, Local: true,
			ProbeInterval: 200 * time.Millisecond, SuspicionMult: 2,
			Meta:   membership.Meta{DataAddr: "127.0.0.1:9" + name[1:], Job: "j", Role: membership.RoleWorker, Rank: -1},
			Logger: testLogger(t),
			Block: func(addr string) bool {
				cutOff, _ := addrs[2].Load().(string)
				return cut.Load() && (i == 2) != (addr == cutOff)
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		addrs[i].Store(n.Addr())
		nodes[i] = n
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, n := range nodes[1:] {
		if err := n.Join(ctx, []string{nodes[0].Addr()}); err != nil {
			t.Fatal(err)
		}
	}
	converged(t, nodes, 3)
	cut.Store(true)
	for _, n := range nodes[:2] {
		waitState(t, n, "w2", membership.Dead)
	}
	waitState(t, nodes[2], "w0", membership.Dead)
	waitState(t, nodes[2], "w1", membership.Dead)
	cut.Store(false)
	if err := nodes[2].Join(ctx, []string{nodes[0].Addr(), nodes[1].Addr()}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		for _, name := range names {
			waitState(t, n, name, membership.Alive)
		}
	}
}
