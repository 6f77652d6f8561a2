package gyre

import (
	"context"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/membership"
	"github.com/gyre-ml/gyre/transport"
)

func TestSeedRoles(t *testing.T) {
	self := func(addr string) func(string) bool { return func(s string) bool { return s == addr } }
	seeds := []string{"a:1", "b:1", "c:1"}
	for _, tc := range []struct {
		name           string
		me             string
		others         []string
		named, starter bool
	}{
		{"the first seed starts", "a:1", []string{"b:1", "c:1"}, true, true},
		{"a later seed joins through the rest", "b:1", []string{"a:1", "c:1"}, true, false},
		{"a worker the seeds do not name joins through all", "d:1", seeds, false, false},
	} {
		others, named, starter := seedRoles(seeds, self(tc.me))
		if !slices.Equal(others, tc.others) || named != tc.named || starter != tc.starter {
			t.Errorf("%s: got %v named %v starter %v, want %v %v %v", tc.name, others, named, starter, tc.others, tc.named, tc.starter)
		}
	}
}

func TestRunningJob(t *testing.T) {
	w := func(id string, epoch uint64) gossipWorker {
		return gossipWorker{member: member{ID: transport.PeerID(id)}, epoch: epoch}
	}
	for _, tc := range []struct {
		name    string
		workers []gossipWorker
		want    bool
	}{
		{"nobody", nil, false},
		{"only pending workers", []gossipWorker{w("b", 0), w("c", 0)}, false},
		{"a member of a view", []gossipWorker{w("b", 0), w("c", 4)}, true},
		// A restarted worker under its old name finds its old self in
		// gossip, in a view, until gossip learns of the restart.
		{"only this worker's old self", []gossipWorker{w("a", 7), w("b", 0)}, false},
	} {
		if got := runningJob(tc.workers, "a"); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSelfSeed(t *testing.T) {
	key := make([]byte, 32)
	n, err := membership.Start(membership.Config{Name: "w", Listen: "127.0.0.1:0", Key: key, Local: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	_, port, _ := net.SplitHostPort(n.Addr())
	w := &Worker{cfg: Config{Listen: "127.0.0.1:0"}, node: n}
	isSelf := w.selfSeed(context.Background())
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	for seed, want := range map[string]bool{
		// This machine's name, in a domain that need not resolve: a
		// pod's own DNS record may be stale or missing.
		host + ".gyre.invalid:" + port:  true,
		host + "x.gyre.invalid:" + port: false,
		host + ".gyre.invalid:1":        false,
		"127.0.0.1:" + port:             true,
		"localhost:" + port:             true, // a name that resolves to this host
		"127.0.0.2:" + port:             false,
		"127.0.0.1:1":                   false,
		"no-such-host.invalid:" + port:  false,
		"garbage":                       false,
	} {
		if got := isSelf(seed); got != want {
			t.Errorf("seed %q: self %v, want %v", seed, got, want)
		}
	}
}
