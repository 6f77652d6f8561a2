package gyretest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/testhook"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// Transports a Cluster runs over.
const (
	Mem  = "mem"  // in process, with fault injection (the default)
	QUIC = "quic" // real QUIC on loopback
	TCP  = "tcp"  // real TLS over TCP on loopback
)

// Options describe an in-process cluster.
type Options struct {
	// N is the number of workers.
	N int
	// Transport is Mem (default), QUIC or TCP.
	Transport string
	// Config, if set, adjusts rank's Config after the harness filled in
	// the view, the secret and the logger.
	Config func(rank int, c *gyre.Config)
	// State, if set, returns the state rank registers; the Cluster keeps
	// it for EnsureSameState.
	State func(rank int) *gyre.State
	// Options, if set, returns further Join options for rank.
	Options func(rank int) []gyre.Option
	// JoinTimeout bounds the joins. Default 30 s.
	JoinTimeout time.Duration
	// Links, if set, shapes the mem network's links before the workers
	// join (mem.Network.SetLink), for behaviour Join already meets, such
	// as the link probes that order the ring. ids are in rank order.
	Links func(net *mem.Network, ids []transport.PeerID)
	// Gossip makes the workers find each other by gossip (real memberlist
	// on loopback, local timing) instead of a static view: worker 0 starts
	// the job, the others join through it, and iteration 0 waits for all
	// N. A worker's index is then its start order, not its rank.
	Gossip bool
	// SharedSeeds, with Gossip, gives every worker the same seeds, every
	// gossip address with worker 0's first, as a StatefulSet gives its
	// pods one command: worker 0 is the starter (gyre.Config.Seeds).
	SharedSeeds bool
	// Unreachable, if set, says which workers (by index) cannot be
	// reached on the data plane, as behind a firewall that drops what
	// arrives, or with a wrong --advertise: such a worker advertises the
	// address of a socket that reads nothing, while it dials out from its
	// real one. Real transports only.
	Unreachable func(index int) bool
	// Machine, if set, gives the worker of each index the machine its
	// link probes report, so that the workers of this one process stand
	// for several machines (the hierarchical allreduce's); "" keeps the
	// real one.
	Machine func(index int) string
}

// Cluster is N workers joined in this process.
type Cluster struct {
	// Workers are in rank order; a worker whose Join failed is nil, and
	// Errs holds why.
	Workers []*gyre.Worker
	Errs    []error
	// States are the registered states (nil without Options.State).
	States []*gyre.State
	// IDs are the workers' transport IDs, which are also their addresses.
	IDs []transport.PeerID
	// Net is the in-memory network, nil over real transports.
	Net *mem.Network
	// GossipAddrs are the workers' gossip addresses with Options.Gossip:
	// any of them is a seed for a later joiner.
	GossipAddrs []string

	o   Options
	key string
	// cut maps each gossip address to its group while Partition holds
	// (nil otherwise); the workers' gossip blocks read it.
	cutMu sync.Mutex
	cut   map[string]int
}

// Start joins o.N workers concurrently and returns them with their Join
// errors. Everything is closed when the test ends.
func Start(tb testing.TB, o Options) *Cluster {
	tb.Helper()
	if o.N < 1 {
		tb.Fatalf("gyretest: N = %d", o.N)
	}
	if o.JoinTimeout == 0 {
		o.JoinTimeout = 30 * time.Second
	}
	c := &Cluster{Workers: make([]*gyre.Worker, o.N), Errs: make([]error, o.N),
		States: make([]*gyre.State, o.N), IDs: make([]transport.PeerID, o.N), o: o}
	switch o.Transport {
	case "", Mem:
		c.Net = mem.NewNetwork(1)
	case QUIC, TCP:
	default:
		tb.Fatalf("gyretest: unknown transport %q", o.Transport)
	}
	peers, gossip := c.addrs(tb, 0, o.N)
	if c.Net == nil || o.Gossip {
		c.key = Key(tb)
	}
	if o.Gossip {
		c.GossipAddrs = gossip
	}
	for r := range o.N {
		c.IDs[r] = transport.PeerID(peers[r])
	}
	if o.Links != nil {
		o.Links(c.mem(tb), c.IDs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.JoinTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for r := range o.N {
		cfg := gyre.Config{Key: c.key, Peers: peers, Rank: r, Transport: o.Transport, Logger: new(transporttest.Logger(tb))}
		if o.Gossip {
			cfg = c.gossipConfig(tb, r, peers[r], c.GossipAddrs[r], nil)
			cfg.MinWorkers = o.N
		}
		if c.Net != nil {
			cfg.Transport = ""
		}
		if o.Config != nil {
			o.Config(r, &cfg)
		}
		opts := c.options(tb, r, c.IDs[r], cfg)
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Workers[r], c.Errs[r] = gyre.Join(c.hooked(ctx, r, cfg), cfg, opts...)
		}()
	}
	wg.Wait()
	tb.Cleanup(func() {
		for _, w := range c.Workers {
			if w != nil {
				w.Close()
			}
		}
	})
	return c
}

// addrs returns the data and gossip addresses of workers first to
// first+n-1: data addresses are names only over mem, which never dials,
// else free loopback ports. All the ports come from one search, so no two
// are alike: ports found apart can repeat, the first set being free again
// when the second is sought.
func (c *Cluster) addrs(tb testing.TB, first, n int) (data, gossip []string) {
	tb.Helper()
	taken := make([]string, 0, len(c.IDs))
	for _, id := range c.IDs {
		taken = append(taken, string(id))
	}
	if c.Net == nil {
		ports := freePortsBut(tb, 2*n, taken, c.GossipAddrs)
		return ports[:n:n], ports[n:]
	}
	data = make([]string, n)
	for r := range data {
		data[r] = fmt.Sprintf("127.0.0.1:%d", 1000+first+r)
	}
	return data, freePortsBut(tb, n, c.GossipAddrs)
}

// freePortsBut is freePorts avoiding the addresses in the taken lists:
// ports handed out before whose processes may not have bound them yet.
func freePortsBut(tb testing.TB, n int, taken ...[]string) []string {
	tb.Helper()
	for range 100 {
		ports := freePorts(tb, n)
		if !slices.ContainsFunc(ports, func(p string) bool {
			return slices.ContainsFunc(taken, func(list []string) bool { return slices.Contains(list, p) })
		}) {
			return ports
		}
	}
	tb.Fatal("gyretest: no free ports apart from those handed out")
	return nil
}

func freePorts(tb testing.TB, n int) []string {
	tb.Helper()
	addrs, err := launch.FreePorts(n)
	if err != nil {
		tb.Fatal(err)
	}
	return addrs
}

// gossipConfig is the Config of a gossiping worker at index r: the first
// starts the job, the others join through seeds (default: worker 0).
func (c *Cluster) gossipConfig(tb testing.TB, r int, data, listen string, seeds []string) gyre.Config {
	cfg := gyre.Config{Key: c.key, Transport: c.o.Transport, Listen: listen, DataAddr: data, Name: data,
		GossipTiming: gyre.GossipLocal, Logger: new(transporttest.Logger(tb))}
	switch {
	case c.o.SharedSeeds && seeds == nil:
		cfg.Seeds = c.GossipAddrs
	case r > 0:
		cfg.Seeds = seeds
		if seeds == nil {
			cfg.Seeds = c.GossipAddrs[:1]
		}
	}
	return cfg
}

// options are the Join options of worker r with cfg: its state, the
// caller's options, over mem its transport, and the transport of an
// unreachable worker.
func (c *Cluster) options(tb testing.TB, r int, id transport.PeerID, cfg gyre.Config) []gyre.Option {
	var opts []gyre.Option
	if c.o.State != nil {
		c.States[r] = c.o.State(r)
		opts = append(opts, gyre.WithState(c.States[r]))
	}
	if c.o.Options != nil {
		opts = append(opts, c.o.Options(r)...)
	}
	if c.Net != nil {
		tr, err := c.Net.Join(id)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tr.Close() })
		opts = append(opts, gyre.WithTransport(tr))
	}
	if c.o.Unreachable != nil && c.o.Unreachable(r) {
		opts = append(opts, c.unreachable(tb, cfg))
	}
	return opts
}

// hooked returns ctx carrying, with Options.Gossip, the cut that
// Partition puts in the gossip of the worker of cfg, and its
// Options.Machine: test seams, which reach the worker through package
// testhook, not the public API.
func (c *Cluster) hooked(ctx context.Context, index int, cfg gyre.Config) context.Context {
	if !c.o.Gossip && c.o.Machine == nil {
		return ctx
	}
	self := cfg.Listen
	return testhook.With(ctx, func(h *testhook.Hooks) {
		if c.o.Gossip {
			h.GossipBlock = func(addr string) bool { return c.gossipCut(self, addr) }
		}
		if c.o.Machine != nil {
			h.Machine = c.o.Machine(index)
		}
	})
}

// gossipCut reports whether Partition puts the gossip addresses from and
// to in different groups.
func (c *Cluster) gossipCut(from, to string) bool {
	c.cutMu.Lock()
	defer c.cutMu.Unlock()
	gf, okF := c.cut[from]
	gt, okT := c.cut[to]
	return okF && okT && gf != gt
}

// unreachable returns the Join option that makes the worker with cfg
// unreachable (Options.Unreachable): its own transport, advertised at a
// blackhole.
func (c *Cluster) unreachable(tb testing.TB, cfg gyre.Config) gyre.Option {
	tb.Helper()
	if c.Net != nil {
		tb.Fatal("gyretest: Unreachable needs a real transport")
	}
	tr, err := gyre.NewTransport(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	hole, err := blackhole(cfg.WithDefaults().Transport)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		tr.Close()
		_ = hole.Close()
	})
	return gyre.WithTransport(advertisedAt{Transport: tr, addr: hole.addr})
}

// advertisedAt is a transport that reports addr as its address.
type advertisedAt struct {
	transport.Transport
	addr string
}

func (a advertisedAt) Addr() string { return a.addr }

// hole is a loopback socket that takes what arrives and never answers:
// a UDP socket that reads nothing, or a TCP listener that accepts
// nothing (the kernel completes handshakes into its backlog, and no TLS
// handshake ever answers).
type hole struct {
	addr  string
	Close func() error
}

func blackhole(tr string) (hole, error) {
	if tr == QUIC {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			return hole{}, err
		}
		return hole{addr: pc.LocalAddr().String(), Close: pc.Close}, nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return hole{}, err
	}
	return hole{addr: ln.Addr().String(), Close: ln.Close}, nil
}

// Joiner is a worker joining a gossiping Cluster at run time.
type Joiner struct {
	// Index is its index in the Cluster's slices once it has joined.
	Index int
	done  chan struct{}
	// cancel is behind a pointer so that Joiner stays comparable, as it
	// was in 0.1.0 (a func field would not be).
	cancel *context.CancelFunc
	w      *gyre.Worker
	err    error
}

// AddJoiner starts one more worker joining a gossiping cluster through
// seeds (default: worker 0's gossip address). Its Join waits, pending,
// until a boundary admits it, so the caller keeps training meanwhile and
// collects it with Wait. Its state comes from Options.State and its Config
// from Options.Config, called with its index.
func (c *Cluster) AddJoiner(tb testing.TB, seeds ...string) *Joiner {
	tb.Helper()
	if !c.o.Gossip {
		tb.Fatal("gyretest: AddJoiner needs Options.Gossip")
	}
	r := len(c.Workers)
	datas, gossips := c.addrs(tb, r, 1)
	data, listen := datas[0], gossips[0]
	c.Workers, c.Errs = append(c.Workers, nil), append(c.Errs, nil)
	c.States, c.IDs = append(c.States, nil), append(c.IDs, transport.PeerID(data))
	c.GossipAddrs = append(c.GossipAddrs, listen)
	cfg := c.gossipConfig(tb, r, data, listen, seeds)
	if c.Net != nil {
		cfg.Transport = ""
	}
	if c.o.Config != nil {
		c.o.Config(r, &cfg)
	}
	opts := c.options(tb, r, c.IDs[r], cfg)
	ctx, cancel := context.WithTimeout(context.Background(), c.o.JoinTimeout)
	j := &Joiner{Index: r, done: make(chan struct{}), cancel: &cancel}
	go func() {
		defer close(j.done)
		defer cancel()
		j.w, j.err = gyre.Join(c.hooked(ctx, r, cfg), cfg, opts...)
	}()
	tb.Cleanup(func() {
		<-j.done
		if j.w != nil {
			j.w.Close()
		}
	})
	return j
}

// Cancel ends the joiner's Join now, as if its JoinTimeout had passed: a
// joiner that is to stay pending is then done without the wait.
func (j *Joiner) Cancel() { (*j.cancel)() }

// Wait waits for the joiner's Join, records the worker in the Cluster at
// its Index, and returns it.
func (j *Joiner) Wait(c *Cluster) (*gyre.Worker, error) {
	<-j.done
	c.Workers[j.Index], c.Errs[j.Index] = j.w, j.err
	return j.w, j.err
}

// MakeCluster is Start for clusters that must join: it fails the test on
// any Join error.
func MakeCluster(tb testing.TB, o Options) *Cluster {
	tb.Helper()
	c := Start(tb, o)
	if err := errors.Join(c.Errs...); err != nil {
		tb.Fatalf("gyretest: join: %v", err)
	}
	return c
}

// Run calls f for every worker concurrently, with its rank, and returns
// the errors in rank order. Workers that failed to join are skipped.
func (c *Cluster) Run(f func(rank int, w *gyre.Worker) error) []error { return Each(c.Workers, f) }

// Each calls f for every non-nil worker of ws concurrently, with its index
// as rank, and returns the errors in that order.
func Each(ws []*gyre.Worker, f func(rank int, w *gyre.Worker) error) []error {
	errs := make([]error, len(ws))
	var wg sync.WaitGroup
	for r, w := range ws {
		if w == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = f(r, w)
		}()
	}
	wg.Wait()
	return errs
}

// mem returns the in-memory network, failing tb over real transports.
func (c *Cluster) mem(tb testing.TB) *mem.Network {
	tb.Helper()
	if c.Net == nil {
		tb.Fatal("gyretest: fault injection needs the mem transport")
	}
	return c.Net
}

// Kill crashes rank as kill -9 crashes a process: its transport dies, so
// its peers fail at once, as when a dead process's connections reset,
// and its gossip stops without a word, as a dead process's does. The
// worker is closed; the test's goroutine running it must stop using it.
// Over a real transport the worker's own transport closes its
// connections; to test silence without a reset, use real processes.
func (c *Cluster) Kill(tb testing.TB, rank int) {
	if c.Net != nil {
		c.Net.Kill(c.IDs[rank])
	}
	if w := c.Workers[rank]; w != nil {
		w.Close()
	}
}

// Freeze stops rank as SIGSTOP stops a process: connections stay up, it
// falls silent, and its peers must tell it from a late worker by its
// missing heartbeats. Thaw resumes it.
func (c *Cluster) Freeze(tb testing.TB, rank int) { c.mem(tb).Freeze(c.IDs[rank]) }

// Thaw resumes a rank stopped by Freeze.
func (c *Cluster) Thaw(tb testing.TB, rank int) { c.mem(tb).Thaw(c.IDs[rank]) }

// Partition cuts the cluster into groups of ranks: messages between groups
// are lost, the workers' gossip included (Options.Gossip). Ranks in no
// group form one more group.
func (c *Cluster) Partition(tb testing.TB, groups ...[]int) {
	ids := make([][]transport.PeerID, len(groups))
	cut := map[string]int{}
	for r := range c.GossipAddrs {
		cut[c.GossipAddrs[r]] = len(groups) // in no group
	}
	for i, g := range groups {
		for _, r := range g {
			ids[i] = append(ids[i], c.IDs[r])
			if r < len(c.GossipAddrs) {
				cut[c.GossipAddrs[r]] = i
			}
		}
	}
	c.mem(tb).Partition(ids...)
	c.cutMu.Lock()
	c.cut = cut
	c.cutMu.Unlock()
}

// Heal removes the partition, gossip's included.
func (c *Cluster) Heal(tb testing.TB) {
	c.mem(tb).Heal()
	c.cutMu.Lock()
	c.cut = nil
	c.cutMu.Unlock()
}

// EnsureSameState fails the test, naming the ranks, unless every
// registered state has rank 0's digest.
func (c *Cluster) EnsureSameState(tb testing.TB) {
	tb.Helper()
	EnsureSameState(tb, c.States...)
}

// EnsureSameState fails the test unless every state has the digest of the
// first, naming the ranks (indices) that differ.
func EnsureSameState(tb testing.TB, states ...*gyre.State) {
	tb.Helper()
	if len(states) == 0 || states[0] == nil {
		tb.Fatal("gyretest: EnsureSameState needs the registered states (Options.State)")
	}
	want, err := states[0].Digest()
	if err != nil {
		tb.Fatal(err)
	}
	var diff []int
	for r, s := range states[1:] {
		d, err := s.Digest()
		if err != nil {
			tb.Fatal(err)
		}
		if d != want {
			diff = append(diff, r+1)
		}
	}
	if len(diff) > 0 {
		tb.Fatalf("gyretest: ranks %v hold a different state from rank 0", diff)
	}
}

// Key returns a fresh cluster secret, hex-encoded as Config.Key takes it.
func Key(tb testing.TB) string {
	tb.Helper()
	s, err := secret.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	return s.Hex()
}
