package membership_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/membership"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
	logger := transporttest.Logger(t)
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
