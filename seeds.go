package gyre

import (
	"context"
	"net"
	"os"
	"strings"
	"time"
)

// Starting once: the first seed (docs/membership.md). A Kubernetes
// StatefulSet or a Slurm srun gives every worker the same arguments, so
// every worker may be given the same seed list, its own address among
// them. The first seed is the job's starter: the worker that seed names
// joins gossip through the other seeds, and joins the job if gossip
// shows one running under this Job name; if no other seed answers, or
// none is in a running job, it starts the job. Every other worker leaves
// its own address out and joins through the rest. So a starter restarted
// while its job runs rejoins that job instead of starting a second one.

// seedRoles splits seeds into the other workers' addresses and whether
// this worker, which isSelf recognises, is the starter.
func seedRoles(seeds []string, isSelf func(string) bool) (others []string, named, starter bool) {
	for i, s := range seeds {
		if isSelf(s) {
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
func runningJob(workers []gossipWorker, self string) bool {
	for _, g := range workers {
		if g.epoch > 0 && string(g.ID) != self {
			return true
		}
	}
	return false
}

// seedLookup bounds the name lookup of one seed.
const seedLookup = 2 * time.Second

// selfSeed returns a test of whether a seed address names this worker:
// its port is the bound gossip port, and its host is, or resolves to,
// the gossip address's host or Listen's, or is a name whose first label
// is this machine's host name (a pod's DNS record may still hold its
// previous address for a while after a restart, or none yet). The seeds
// are looked at again at every attempt.
func (w *Worker) selfSeed(ctx context.Context) func(string) bool {
	hostname, _ := os.Hostname()
	hostname, _, _ = strings.Cut(hostname, ".")
	hosts := map[string]bool{}
	var port string
	if h, p, err := net.SplitHostPort(w.node.Addr()); err == nil {
		hosts[h], port = true, p
	}
	if h, _, err := net.SplitHostPort(w.cfg.Listen); err == nil {
		hosts[h] = true
	}
	return func(seed string) bool {
		h, p, err := net.SplitHostPort(seed)
		if err != nil || p != port {
			return false
		}
		if hosts[h] {
			return true
		}
		if net.ParseIP(h) != nil {
			return false
		}
		if label, _, _ := strings.Cut(h, "."); hostname != "" && strings.EqualFold(label, hostname) {
			return true
		}
		lctx, cancel := context.WithTimeout(ctx, seedLookup)
		defer cancel()
		ips, err := net.DefaultResolver.LookupHost(lctx, h)
		if err != nil {
			return false
		}
		for _, ip := range ips {
			if hosts[ip] {
				return true
			}
		}
		return false
	}
}
