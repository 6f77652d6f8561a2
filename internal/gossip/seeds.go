package gossip

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/gyre-ml/gyre/internal/admission"
)

// Starting once: the first seed (docs/membership.md). A Kubernetes
// StatefulSet or a Slurm srun gives every worker the same arguments, so
// every worker may be given the same seed list, its own address among
// them. The first seed is the job's starter: the worker that seed names
// joins gossip through the other seeds, and joins the job if gossip
// shows one running under this Job name; if the other seeds answer that
// they are not there, or run no job, it starts the job. Every other
// worker leaves its own address out and joins through the rest. So a
// starter restarted while its job runs rejoins that job instead of
// starting a second one.

// seedRoles splits seeds into the other workers' addresses and whether
// the list names this worker (self[i] says seed i does) and this worker
// is the starter.
func seedRoles(seeds []string, self []bool) (others []string, named, starter bool) {
	for i, s := range seeds {
		if self[i] {
			named = true
			starter = starter || i == 0
			continue
		}
		others = append(others, s)
	}
	return others, named, starter
}

// runningJob reports whether workers, the job's workers in gossip,
// include one in a view (epoch above 0) besides self.
func runningJob(workers []admission.Worker, self string) bool {
	for _, g := range workers {
		if g.Epoch > 0 && string(g.ID) != self {
			return true
		}
	}
	return false
}

// seedAnswer is how one seed answered an attempt to join through it.
type seedAnswer int

const (
	// seedJoined: gossip joined through it.
	seedJoined seedAnswer = iota
	// seedAbsent: nothing is there (refused, no such name, no route).
	seedAbsent
	// seedSilent: no answer in time. A hung host, or a live member too
	// busy to answer: it may be in the job.
	seedSilent
)

// answerOf classifies a join's error.
func answerOf(err error) seedAnswer {
	if err == nil {
		return seedJoined
	}
	var dns *net.DNSError
	if errors.As(err, &dns) && dns.IsNotFound {
		return seedAbsent
	}
	for _, absent := range []string{"connection refused", "no such host", "no route to host", "network is unreachable"} {
		if strings.Contains(err.Error(), absent) {
			return seedAbsent
		}
	}
	return seedSilent
}

// seedStep is what a worker with seeds does after an attempt.
type seedStep int

const (
	stepRetry seedStep = iota
	stepPend           // wait, pending, for a boundary to admit it
	stepStart          // start the job
)

func (s seedStep) String() string {
	return [...]string{"retry", "pend", "start"}[s]
}

// nextSeedStep decides after an attempt: answers are the other seeds',
// running says gossip lists a worker of the job in a view, and patient
// that the starter may still wait for silent seeds. Only the starter
// starts, and only once no seed that might be in the job is silent, or
// its patience ran out.
func nextSeedStep(starter bool, answers []seedAnswer, running, patient bool) seedStep {
	joined, silent := false, false
	for _, a := range answers {
		joined = joined || a == seedJoined
		silent = silent || a == seedSilent
	}
	switch {
	case running || !starter && joined:
		return stepPend
	case !starter:
		return stepRetry
	case silent && patient:
		return stepRetry
	default:
		return stepStart
	}
}

// starterPatience is how long the starter waits for seeds that do not
// answer (a hung host may be a member of the running job) before it
// starts the job without them. A variable for tests.
var starterPatience = 30 * time.Second

// seedJoinTimeout bounds the join through one seed: above memberlist's
// own connection timeout (10 s with LAN timing), so that a join given
// up on is over, not merging gossip later.
const seedJoinTimeout = 15 * time.Second

// seedLookup bounds the name lookup of one seed.
const seedLookup = 2 * time.Second

// selfSeeds reports which seeds name this worker: the port is its bound
// gossip port, and the host is a name whose first label is this
// machine's host name (a pod's DNS record may hold its previous address
// for a while after a restart, or none yet), or else is, or resolves
// to, its gossip or Listen host. When some seed names this machine by
// its host name, a seed of another name that resolves here is another
// worker's stale record, not this worker.
func (g *Gossip) selfSeeds(ctx context.Context, seeds []string) []bool {
	hostname, _ := os.Hostname()
	hostname, _, _ = strings.Cut(hostname, ".")
	hosts := map[netip.Addr]bool{}
	var port string
	for _, a := range []string{g.node.Addr(), g.cfg.Listen} {
		h, p, err := net.SplitHostPort(a)
		if ip, perr := netip.ParseAddr(h); err == nil && perr == nil {
			hosts[ip.Unmap()] = true
		}
		if port == "" {
			port = p
		}
	}
	self := make([]bool, len(seeds))
	byName := false
	for i, s := range seeds {
		h, p, err := net.SplitHostPort(s)
		if err != nil || p != port {
			continue
		}
		if label, _, _ := strings.Cut(h, "."); hostname != "" && net.ParseIP(h) == nil && strings.EqualFold(label, hostname) {
			self[i], byName = true, true
		}
	}
	if byName {
		return self
	}
	for i, s := range seeds {
		h, p, err := net.SplitHostPort(s)
		if err != nil || p != port {
			continue
		}
		if ip, err := netip.ParseAddr(h); err == nil {
			self[i] = hosts[ip.Unmap()]
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, seedLookup)
		ips, _ := net.DefaultResolver.LookupNetIP(lctx, "ip", h) // no answer: not this worker
		cancel()
		for _, ip := range ips {
			self[i] = self[i] || hosts[ip.Unmap()]
		}
	}
	return self
}

// joinEach joins gossip through each seed at once, and returns each
// one's answer, and their errors joined. The starter (all) waits for
// every answer, bounded by seedJoinTimeout; another worker returns at
// the first seed joined, and leaves the rest to finish on their own.
func (g *Gossip) joinEach(ctx context.Context, seeds []string, all bool) ([]seedAnswer, error) {
	type result struct {
		i   int
		err error
	}
	results := make(chan result, len(seeds))
	for i, s := range seeds {
		go func() {
			jctx, cancel := context.WithTimeout(ctx, seedJoinTimeout)
			defer cancel()
			results <- result{i, g.node.Join(jctx, []string{s})}
		}()
	}
	answers := make([]seedAnswer, len(seeds))
	for i := range answers {
		answers[i] = seedSilent // until it answers
	}
	var msgs []string
	for range seeds {
		r := <-results
		answers[r.i] = answerOf(r.err)
		if r.err == nil && !all {
			return answers, nil
		}
		if r.err != nil {
			msgs = append(msgs, r.err.Error())
		}
	}
	if len(msgs) == 0 {
		return answers, nil
	}
	return answers, errors.New(strings.Join(msgs, "; "))
}

// SetStarterPatience sets how long the first seed waits for seeds that
// do not answer, for tests, and returns a function that restores it.
func SetStarterPatience(d time.Duration) (restore func()) {
	old := starterPatience
	starterPatience = d
	return func() { starterPatience = old }
}
