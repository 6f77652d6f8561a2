package gyretest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/internal/secret"
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
		States: make([]*gyre.State, o.N), IDs: make([]transport.PeerID, o.N)}
	peers := make([]string, o.N)
	var key string
	switch o.Transport {
	case "", Mem:
		c.Net = mem.NewNetwork(1)
		for r := range peers {
			peers[r] = fmt.Sprintf("127.0.0.1:%d", 1000+r) // names only: mem never dials
		}
	case QUIC, TCP:
		addrs, err := launch.FreePorts(o.N)
		if err != nil {
			tb.Fatal(err)
		}
		copy(peers, addrs)
		key = Key(tb)
	default:
		tb.Fatalf("gyretest: unknown transport %q", o.Transport)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.JoinTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for r := range o.N {
		c.IDs[r] = transport.PeerID(peers[r])
		cfg := gyre.Config{Key: key, Peers: peers, Rank: r, Transport: o.Transport, Logger: transporttest.Logger(tb)}
		if c.Net != nil {
			cfg.Transport = ""
		}
		if o.Config != nil {
			o.Config(r, &cfg)
		}
		var opts []gyre.Option
		if o.State != nil {
			c.States[r] = o.State(r)
			opts = append(opts, gyre.WithState(c.States[r]))
		}
		if o.Options != nil {
			opts = append(opts, o.Options(r)...)
		}
		if c.Net != nil {
			tr, err := c.Net.Join(c.IDs[r])
			if err != nil {
				tb.Fatal(err)
			}
			tb.Cleanup(func() { tr.Close() })
			opts = append(opts, gyre.WithTransport(tr))
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.Workers[r], c.Errs[r] = gyre.Join(ctx, cfg, opts...)
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

// Kill crashes rank's transport: its peers fail at once, as after kill -9
// of a process whose connections reset.
func (c *Cluster) Kill(tb testing.TB, rank int) { c.mem(tb).Kill(c.IDs[rank]) }

// Freeze stops rank as SIGSTOP stops a process: connections stay up, it
// falls silent, and its peers must tell it from a late worker by its
// missing heartbeats. Thaw resumes it.
func (c *Cluster) Freeze(tb testing.TB, rank int) { c.mem(tb).Freeze(c.IDs[rank]) }

// Thaw resumes a rank stopped by Freeze.
func (c *Cluster) Thaw(tb testing.TB, rank int) { c.mem(tb).Thaw(c.IDs[rank]) }

// Partition cuts the cluster into groups of ranks: messages between groups
// are lost. Ranks in no group form one more group.
func (c *Cluster) Partition(tb testing.TB, groups ...[]int) {
	ids := make([][]transport.PeerID, len(groups))
	for i, g := range groups {
		for _, r := range g {
			ids[i] = append(ids[i], c.IDs[r])
		}
	}
	c.mem(tb).Partition(ids...)
}

// Heal removes the partition.
func (c *Cluster) Heal(tb testing.TB) { c.mem(tb).Heal() }

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
