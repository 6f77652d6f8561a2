package gossip

import (
	"context"
	"errors"
	"net"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/internal/admission"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/membership"
	"github.com/gyre-ml/gyre/transport"
)

func TestSeedRoles(t *testing.T) {
	seeds := []string{"a:1", "b:1", "c:1"}
	for _, tc := range []struct {
		name           string
		self           []bool
		others         []string
		named, starter bool
	}{
		{"the first seed starts", []bool{true, false, false}, []string{"b:1", "c:1"}, true, true},
		{"a later seed joins through the rest", []bool{false, true, false}, []string{"a:1", "c:1"}, true, false},
		{"a worker the seeds do not name joins through all", []bool{false, false, false}, seeds, false, false},
	} {
		others, named, starter := seedRoles(seeds, tc.self)
		if !slices.Equal(others, tc.others) || named != tc.named || starter != tc.starter {
			t.Errorf("%s: got %v named %v starter %v, want %v %v %v", tc.name, others, named, starter, tc.others, tc.named, tc.starter)
		}
	}
}

func TestRunningJob(t *testing.T) {
	w := func(id string, epoch uint64) admission.Worker {
		return admission.Worker{Member: vote.Member{ID: transport.PeerID(id)}, Epoch: epoch}
	}
	for _, tc := range []struct {
		name    string
		workers []admission.Worker
		want    bool
	}{
		{"nobody", nil, false},
		{"only pending workers", []admission.Worker{w("b", 0), w("c", 0)}, false},
		{"a member of a view", []admission.Worker{w("b", 0), w("c", 4)}, true},
		// A restarted worker under its old name finds its old self in
		// gossip, in a view, until gossip learns of the restart.
		{"only this worker's old self", []admission.Worker{w("a", 7), w("b", 0)}, false},
	} {
		if got := runningJob(tc.workers, "a"); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestAnswerOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want seedAnswer
	}{
		{nil, seedJoined},
		{errors.New("dial tcp 10.0.0.2:7946: connect: connection refused"), seedAbsent},
		{&net.DNSError{Err: "no such host", Name: "gyre-1.gyre", IsNotFound: true}, seedAbsent},
		{errors.New("dial tcp 10.0.0.2:7946: connect: no route to host"), seedAbsent},
		{errors.New("dial tcp 10.0.0.2:7946: i/o timeout"), seedSilent},
		{context.DeadlineExceeded, seedSilent},
	} {
		if got := answerOf(tc.err); got != tc.want {
			t.Errorf("%v: answer %d, want %d", tc.err, got, tc.want)
		}
	}
}

func TestNextSeedStep(t *testing.T) {
	j, a, s := seedJoined, seedAbsent, seedSilent
	for _, tc := range []struct {
		name             string
		starter          bool
		answers          []seedAnswer
		running, patient bool
		want             seedStep
	}{
		{"a joiner that reached a seed waits to be admitted", false, []seedAnswer{a, j}, false, true, stepPend},
		{"a joiner that reached nobody tries again", false, []seedAnswer{a, s}, false, false, stepRetry},
		{"a joiner never starts, even out of patience", false, []seedAnswer{a, a}, false, false, stepRetry},
		{"the starter joins a running job", true, []seedAnswer{j, a}, true, true, stepPend},
		{"a running job behind one seed wins over a silent one", true, []seedAnswer{s, j}, true, true, stepPend},
		{"the starter starts when the others run no job", true, []seedAnswer{j, j}, false, true, stepStart},
		{"the starter starts when nobody is there", true, []seedAnswer{a, a}, false, true, stepStart},
		{"the starter waits for a silent seed", true, []seedAnswer{a, s}, false, true, stepRetry},
		{"the starter waits for a silent seed even if others answered", true, []seedAnswer{j, s}, false, true, stepRetry},
		{"the starter starts once its patience runs out", true, []seedAnswer{a, s}, false, false, stepStart},
	} {
		if got := nextSeedStep(tc.starter, tc.answers, tc.running, tc.patient); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestSelfSeeds(t *testing.T) {
	key := make([]byte, 32)
	n, err := membership.Start(membership.Config{Name: "w", Listen: "127.0.0.1:0", Key: key, Local: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	_, port, _ := net.SplitHostPort(n.Addr())
	w := &Gossip{cfg: Config{Listen: "127.0.0.1:0"}, node: n}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	host, _, _ = strings.Cut(host, ".")
	for seed, want := range map[string]bool{
		"127.0.0.1:" + port:             true,
		"localhost:" + port:             true, // a name that resolves to this host
		"127.0.0.2:" + port:             false,
		"127.0.0.1:1":                   false,
		"no-such-host.invalid:" + port:  false,
		"garbage":                       false,
		"[::ffff:127.0.0.1]:" + port:    true, // another spelling of the address
		host + ".gyre.invalid:" + port:  true, // this machine's name, in a domain that need not resolve
		host + "x.gyre.invalid:" + port: false,
		host + ".gyre.invalid:1":        false,
	} {
		if got := w.selfSeeds(context.Background(), []string{seed}); !got[0] {
			if want {
				t.Errorf("seed %q: not this worker, want it to be", seed)
			}
		} else if !want {
			t.Errorf("seed %q: this worker, want another", seed)
		}
	}
	// A restarted pod's old address may be another pod's now, and its
	// DNS record stale: the seed that names this machine by name wins.
	got := w.selfSeeds(context.Background(), []string{"127.0.0.1:" + port, "localhost:" + port, host + ".gyre.invalid:" + port})
	if !slices.Equal(got, []bool{false, false, true}) {
		t.Errorf("with a seed naming this host by name: %v, want only that seed", got)
	}
}
