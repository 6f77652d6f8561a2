// Package gossip is a worker's side of gossip membership: its
// memberlist node and the metadata it publishes, the seeds and the
// starter that begins a job, what gossip lists of the job's workers, and
// the welcomes that bring a joiner into a view. Gossip is a hint: it
// finds members and joiners, and never decides a view (package vote
// does, from the boundary's table).
package gossip

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/admission"
	"github.com/gyre-ml/gyre/internal/merge"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/kernels"
	"github.com/gyre-ml/gyre/membership"
	"github.com/gyre-ml/gyre/transport"
)

// ProtocolVersion is the protocol in node metadata: workers that speak
// another are never admitted. Version 2 added the admission handshake,
// 3 the cores in the link probes' table, 4 the machines' boot ids in it,
// 5 the job's status in the metadata (membership.Status), which nodes of
// 4 cannot read.
const ProtocolVersion = 5

// seedQuiet is how long a joiner that no seed answers waits before it
// warns, and seedWarnEvery how often it warns again.
const (
	seedQuiet     = time.Second
	seedWarnEvery = 10 * time.Second
)

// ErrJobGone: the starter, pending to join a running job, saw gossip
// list none of the job's workers in a view for jobGoneGrace (the job
// ended, or died, while the starter restarted), so it starts the job.
var ErrJobGone = errors.New("gyre: the job's workers are gone from gossip")

const jobGoneGrace = 5 * time.Second

// Config configures a worker's gossip.
type Config struct {
	// Name is the worker's name; Job the job's; DataAddr its advertised
	// data-plane address, which its metadata carries.
	Name, Job, DataAddr string
	// Listen and Advertise are the gossip address memberlist binds and
	// the host it advertises; Seeds the seeds (gyre.Config.Seeds).
	Listen, Advertise string
	Seeds             []string
	// Key encrypts gossip.
	Key []byte
	// Local, ProbeInterval and SuspicionMult set memberlist's timing.
	Local         bool
	ProbeInterval time.Duration
	SuspicionMult int
	// Block, if set, cuts gossip to the addresses it reports true for
	// (tests' partitions).
	Block  func(addr string) bool
	Logger zerolog.Logger
}

// Gossip is one worker's gossip membership. It is used from the
// worker's goroutine, but Workers and Dead, which admission calls on its
// own goroutines, are safe for concurrent use.
type Gossip struct {
	cfg  Config
	node *membership.Node
	meta *metaPublisher
	log  zerolog.Logger
	// seeds are the gossip seeds but this worker's own address,
	// namedSeed whether the seed list named this worker, and starter
	// whether it named it first (seeds.go).
	seeds              []string
	namedSeed, starter bool
	// departed are the members that left the view, with their data
	// addresses, until gossip stops listing them there.
	departed map[transport.PeerID]string
	// started says this worker's job has run iteration 0 (SetStarted).
	started atomic.Bool
	// pub is what Publish and PublishCommit last set.
	pubMu sync.Mutex
	pub   published
}

// published is the part of this worker's metadata its view sets.
// Status is a worker's part of its job's status in its metadata.
type Status = membership.Status

type published struct {
	epoch  uint64
	rank   int
	lead   string
	commit int64
	status membership.Status
}

// Start starts the worker's gossip node, listed as pending (epoch 0).
func Start(cfg Config) (*Gossip, error) {
	g := &Gossip{cfg: cfg, log: cfg.Logger, departed: map[transport.PeerID]string{}, pub: published{rank: -1}}
	var err error
	g.node, err = membership.Start(membership.Config{Name: cfg.Name, Listen: cfg.Listen, Advertise: cfg.Advertise,
		Key: cfg.Key, Meta: g.nodeMeta(0, -1), Local: cfg.Local, ProbeInterval: cfg.ProbeInterval,
		SuspicionMult: cfg.SuspicionMult, Logger: cfg.Logger, Block: cfg.Block})
	if err != nil {
		return nil, err
	}
	g.meta = newMetaPublisher(g.node, cfg.Logger)
	return g, nil
}

// Addr is the gossip address others reach this worker at: a seed for
// later workers.
func (g *Gossip) Addr() string { return g.node.Addr() }

// Seeds returns the seeds but this worker's own address.
func (g *Gossip) Seeds() []string { return g.seeds }

// NamedSeed says the seed list named this worker; Starter that it named
// it first.
func (g *Gossip) NamedSeed() bool { return g.namedSeed }

// Starter says this worker is the first seed: the one that starts the job.
func (g *Gossip) Starter() bool { return g.starter }

// nodeMeta is this worker's gossip metadata at epoch and rank (0 and -1:
// pending).
func (g *Gossip) nodeMeta(epoch uint64, rank int) membership.Meta {
	return membership.Meta{DataAddr: g.cfg.DataAddr, Job: g.cfg.Job, Protocol: ProtocolVersion,
		Role: membership.RoleWorker, Epoch: epoch, Rank: int32(rank), Device: kernels.Probe().String(), Started: g.started.Load()}
}

// metaOf is p as this worker's metadata: a pending worker (epoch 0)
// names no view in the merge.
func (g *Gossip) metaOf(p published) membership.Meta {
	m := g.nodeMeta(p.epoch, p.rank)
	if p.epoch > 0 {
		m.Lead, m.Commit, m.Status = p.lead, p.commit, p.status
	}
	return m
}

// SetStarted marks the job as past iteration 0 in this worker's
// metadata, from its next Publish on.
func (g *Gossip) SetStarted() {
	if g != nil {
		g.started.Store(true)
	}
}

// StartedElsewhere returns the workers gossip lists in a view of a
// started job (Started, epoch above 0) that are not members of this
// worker's view (isMember) and not this worker: a view still assembling
// yields to them.
func (g *Gossip) StartedElsewhere(isMember func(transport.PeerID) bool) []transport.PeerID {
	var out []transport.PeerID
	for _, w := range g.Workers() {
		if w.Started && w.Epoch > 0 && string(w.ID) != g.cfg.Name && !isMember(w.ID) {
			out = append(out, w.ID)
		}
	}
	return out
}

// Publish gossips, in the background, that this worker runs at epoch
// with rank (0 and -1: pending). A nil Gossip (the static view) does
// nothing.
func (g *Gossip) Publish(epoch uint64, rank int) {
	if g == nil {
		return
	}
	g.pubMu.Lock()
	defer g.pubMu.Unlock()
	g.pub.epoch, g.pub.rank = epoch, rank
	g.meta.publish(g.metaOf(g.pub))
}

// PublishCommit gossips, in the background, this worker's view's lead
// and the committed iteration it publishes for the merge of started views
// (internal/merge), and its status of the job at that commit (gyre
// status), with the epoch and rank Publish last set. A nil Gossip does
// nothing.
func (g *Gossip) PublishCommit(lead string, commit int64, st Status) {
	if g == nil {
		return
	}
	g.pubMu.Lock()
	defer g.pubMu.Unlock()
	g.pub.lead, g.pub.commit, g.pub.status = lead, commit, st
	g.meta.publish(g.metaOf(g.pub))
}

// StartedViews returns the started views of this job that gossip lists
// outside this worker's view (isMember reports its members), by lead,
// each with the highest committed iteration its members publish. A
// worker that names no lead is left out.
func (g *Gossip) StartedViews(isMember func(transport.PeerID) bool) []merge.Sight {
	if g == nil {
		return nil
	}
	return sights(g.Workers(), transport.PeerID(g.cfg.Name), isMember)
}

// sights groups the started workers of ws outside this worker's view (self,
// and the members isMember reports) by the lead their view publishes,
// with the highest committed iteration any of them publishes.
func sights(ws []admission.Worker, self transport.PeerID, isMember func(transport.PeerID) bool) []merge.Sight {
	byLead := map[string]int64{}
	for _, w := range ws {
		if !w.Started || w.Epoch == 0 || w.Lead == "" || w.ID == self || isMember(w.ID) {
			continue
		}
		if c, ok := byLead[w.Lead]; !ok || w.Commit > c {
			byLead[w.Lead] = w.Commit
		}
	}
	out := make([]merge.Sight, 0, len(byLead))
	for lead, commit := range byLead {
		out = append(out, merge.Sight{Lead: lead, Commit: commit})
	}
	slices.SortFunc(out, func(a, b merge.Sight) int { return strings.Compare(a.Lead, b.Lead) })
	return out
}

// JoinSeeds joins gossip through the seeds, retrying while they start,
// and reports whether this worker, the first seed, is to start the job
// (seeds.go). A seed that answers with another cluster secret fails at
// once. ended says why ctx ended, for errors.
func (g *Gossip) JoinSeeds(ctx context.Context, ended func(context.Context) error) (start bool, err error) {
	var warned time.Time
	began := time.Now()
	for attempt := 0; ; attempt++ {
		others, named, starter := seedRoles(g.cfg.Seeds, g.selfSeeds(ctx, g.cfg.Seeds))
		g.seeds, g.namedSeed, g.starter = others, named, starter
		if len(others) == 0 {
			g.log.Info().Strs("seeds", g.cfg.Seeds).Msg("the only seed is this worker: starting the job")
			return true, nil
		}
		answers, err := g.joinEach(ctx, others, starter)
		if err != nil && isKeyMismatch(err) {
			return false, fmt.Errorf("gyre: joining through %v: a seed does not hold this cluster secret (gossip could not be decrypted): %w",
				others, err)
		}
		if ctx.Err() != nil {
			return false, fmt.Errorf("gyre: no seed of %v answered: %w; last attempt: %v", others, ended(ctx), err)
		}
		step := nextSeedStep(starter, answers, g.RunningJob(), time.Since(began) < starterPatience)
		switch {
		case step == stepStart:
			// err, if any, says which seeds did not answer.
			g.log.Info().Err(err).Strs("seeds", others).Msg("this worker is the first seed and no other seed is in a job: starting the job")
			return true, nil
		case step == stepPend && starter:
			g.log.Info().Strs("seeds", others).Msg("this worker is the first seed and the job is running: joining it")
			return false, nil
		case step == stepPend:
			return false, nil
		}
		// A warning after seedQuiet and then every seedWarnEvery: a seed
		// started with its joiners answers within moments, but a wrong
		// address should not wait out JoinTimeout in silence.
		ev := g.log.Debug()
		if time.Since(began) >= seedQuiet && time.Since(warned) >= seedWarnEvery {
			ev, warned = g.log.Warn(), time.Now()
		}
		deadline, _ := ctx.Deadline()
		msg := "no seed answers yet; retrying"
		if starter {
			msg = "this worker is the first seed; waiting for the seeds that do not answer, which may be in the job"
		}
		ev.Err(err).Strs("seeds", others).Int("attempts", attempt+1).Time("until", deadline).Msg(msg)
		select {
		case <-time.After(200 * time.Millisecond):
		case <-ctx.Done():
			return false, fmt.Errorf("gyre: no seed of %v answered: %w; last attempt: %v", others, ended(ctx), err)
		}
	}
}

// RunningJob reports whether gossip lists a worker of the job in a view
// besides this one.
func (g *Gossip) RunningJob() bool { return runningJob(g.Workers(), g.cfg.Name) }

// isKeyMismatch recognises memberlist's errors for gossip it cannot
// decrypt or that is not encrypted as it requires.
func isKeyMismatch(err error) bool {
	msg := err.Error()
	for _, s := range []string{"decrypt", "No installed keys", "encryption", "Encryption"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// ProtocolMismatch says, with a leading "; ", that gossip lists workers
// of this job that speak another protocol version, which this worker
// ignores, or returns "".
func (g *Gossip) ProtocolMismatch() string {
	var others []string
	for _, m := range g.node.Members() {
		if m.MetaErr == nil && m.Meta.Role == membership.RoleWorker && m.Meta.Job == g.cfg.Job && m.Meta.Protocol != ProtocolVersion {
			others = append(others, fmt.Sprintf("%s (protocol %d)", m.Name, m.Meta.Protocol))
		}
	}
	if len(others) == 0 {
		return ""
	}
	slices.Sort(others)
	return fmt.Sprintf("; gossip lists worker(s) of job %q that speak another protocol version than this worker's %d, and ignores them: %s (run the same gyre version everywhere)",
		g.cfg.Job, ProtocolVersion, strings.Join(others, ", "))
}

// Workers returns the live workers of the job that gossip lists, with
// metadata this worker can read and speaking its protocol. It is safe
// for concurrent use.
func (g *Gossip) Workers() []admission.Worker {
	var out []admission.Worker
	for _, m := range g.node.Members() {
		if m.MetaErr != nil || m.Meta.Role != membership.RoleWorker || m.Meta.Job != g.cfg.Job ||
			m.Meta.Protocol != ProtocolVersion || m.Meta.DataAddr == "" {
			continue
		}
		out = append(out, admission.Worker{Member: vote.Member{ID: transport.PeerID(m.Name), Addr: m.Meta.DataAddr},
			Epoch: m.Meta.Epoch, Started: m.Meta.Started, Lead: m.Meta.Lead, Commit: m.Meta.Commit})
	}
	return out
}

// Dead reports whether gossip declared id dead, and its gossip address.
// It is safe for concurrent use.
func (g *Gossip) Dead(id transport.PeerID) (string, bool) {
	for _, m := range g.node.All() {
		if transport.PeerID(m.Name) == id {
			return m.Addr, m.State == membership.Dead
		}
	}
	return "", false
}

// Members reads gossip: the workers of this job it lists live, the
// pending ones not in the view (inView reports a view member), and those
// in some view but not in this one. Of the latter it keeps those at the
// newest epoch gossip lists: a member left at an older one died, or a
// recovery is dropping it, and gossip lists it until it declares it
// dead, seconds later. A joiner that waited to reach it stayed pending
// that long (a job with a few seconds left finished without it).
func (g *Gossip) Members(isMember func(transport.PeerID) bool) (live map[transport.PeerID]bool, pending, inView []vote.Member) {
	live = make(map[transport.PeerID]bool)
	self := transport.PeerID(g.cfg.Name)
	var viewed []admission.Worker
	newest := uint64(0)
	for _, m := range g.Workers() {
		live[m.ID] = true
		switch {
		case m.ID == self, isMember(m.ID), g.departed[m.ID] == m.Addr:
		case m.Epoch == 0:
			pending = append(pending, m.Member)
		default:
			viewed = append(viewed, m)
			newest = max(newest, m.Epoch)
		}
	}
	for _, m := range viewed {
		if m.Epoch == newest {
			inView = append(inView, m.Member)
		}
	}
	return live, pending, inView
}

// Pending returns the joiners gossip lists pending outside the view
// (isMember), and forgets the departed members that gossip has seen go
// or lists back elsewhere.
func (g *Gossip) Pending(isMember func(transport.PeerID) bool) []vote.Member {
	live, pending, _ := g.Members(isMember)
	for id := range g.departed {
		if !live[id] || slices.ContainsFunc(pending, func(m vote.Member) bool { return m.ID == id }) {
			delete(g.departed, id) // gossip has seen it go, or it is back elsewhere
		}
	}
	return pending
}

// Depart records members that left the view: gossip may list them, with
// their metadata of before they joined, for a while yet, and they must
// not look like joiners.
func (g *Gossip) Depart(ms []vote.Member) {
	for _, m := range ms {
		g.departed[m.ID] = m.Addr
	}
}

// Regossip joins gossip again, every regossipEvery until stopped,
// through the seeds and the gossip addresses gossip remembers for
// members: after a partition, each side's gossip holds the other dead
// and never probes it again.
func (g *Gossip) Regossip(ctx context.Context, members []transport.PeerID) (stop func()) {
	return g.rejoinEvery(ctx, func(context.Context) []string {
		addrs := slices.Clone(g.seeds)
		for _, m := range g.node.All() {
			if slices.Contains(members, transport.PeerID(m.Name)) && !slices.Contains(addrs, m.Addr) {
				addrs = append(addrs, m.Addr)
			}
		}
		return addrs
	})
}

// regossipEvery is how often a rejoining worker joins gossip again, and
// how often a member joins its dead seeds again (KeepSeeds).
const regossipEvery = 2 * time.Second

// KeepSeeds joins gossip again, every regossipEvery until stopped,
// through each of this worker's seeds that gossip does not list alive.
// A seed restarted with its own command (README's first worker, with no
// --seed) is then contacted within regossipEvery, and joins the running
// job instead of starting a second one (StartWindow). memberlist stops
// trying a dead node after GossipToTheDeadTime, so it cannot be relied
// on to find it again.
func (g *Gossip) KeepSeeds(ctx context.Context) (stop func()) { return g.rejoinEvery(ctx, g.deadSeeds) }

// rejoinEvery joins gossip through addrs' addresses at once and then
// every regossipEvery, each attempt bounded by regossipEvery, until
// stopped or ctx ends.
func (g *Gossip) rejoinEvery(ctx context.Context, addrs func(context.Context) []string) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if as := addrs(ctx); len(as) > 0 {
				jctx, jcancel := context.WithTimeout(ctx, regossipEvery)
				if err := g.node.Join(jctx, as); err != nil {
					g.log.Debug().Err(err).Strs("addrs", as).Msg("joining gossip again")
				}
				jcancel()
			}
			select {
			case <-time.After(regossipEvery):
			case <-ctx.Done():
				return
			}
		}
	}()
	return func() { cancel(); <-done }
}

// deadSeeds returns this worker's seeds that no live gossip member's
// address matches, host names resolved.
func (g *Gossip) deadSeeds(ctx context.Context) []string {
	alive := map[string]bool{}
	for _, m := range g.node.Members() {
		alive[m.Addr] = true
	}
	var dead []string
	for _, s := range g.seeds {
		if !alive[s] && !aliveAt(ctx, s, alive) {
			dead = append(dead, s)
		}
	}
	return dead
}

// aliveAt reports whether seed, a host name and port, resolves to an
// address in alive.
func aliveAt(ctx context.Context, seed string, alive map[string]bool) bool {
	host, port, err := net.SplitHostPort(seed)
	if err != nil {
		return false
	}
	ips, err := net.DefaultResolver.LookupHost(ctx, host)
	if err != nil {
		return false
	}
	for _, ip := range ips {
		if alive[net.JoinHostPort(ip, port)] {
			return true
		}
	}
	return false
}

// StartWindow is how long a worker that would start a job at once (no
// --seed, no --min-workers wait) first listens for a running job's
// members: they join their dead seeds again every regossipEvery
// (KeepSeeds), so a seed restarted with its own command hears from them
// in this time, and joins their job.
const StartWindow = 3 * time.Second

// AwaitRunningJob listens up to StartWindow, or until ctx ends, for gossip
// to list a worker of the job in a view, and reports whether one did.
func (g *Gossip) AwaitRunningJob(ctx context.Context) bool {
	deadline := time.Now().Add(StartWindow)
	for time.Now().Before(deadline) {
		if g.RunningJob() {
			return true
		}
		select {
		case <-time.After(50 * time.Millisecond):
		case <-ctx.Done():
			return false
		}
	}
	return g.RunningJob()
}

// Leave tells gossip this worker leaves, so the others list it as left
// rather than dead. When the whole job ends together nobody may be left
// to hear it, which is no error. A nil Gossip does nothing.
func (g *Gossip) Leave() {
	if g == nil {
		return
	}
	g.meta.stop()
	if err := g.node.Leave(time.Second); err != nil {
		g.log.Debug().Err(err).Msg("leaving gossip")
	}
}

// Close stops gossip at once; it is idempotent, and a nil Gossip does
// nothing.
func (g *Gossip) Close() {
	if g == nil {
		return
	}
	g.meta.stop()
	g.node.Close()
}
