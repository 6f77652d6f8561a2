package membership

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/go-multierror"
	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
)

// Config configures a Node.
type Config struct {
	// Name is the node's unique name. Required.
	Name string
	// Listen is the gossip address, host:port, bound exactly (TCP and UDP).
	// Port 0 picks a free port. Required: never memberlist's 0.0.0.0.
	Listen string
	// Advertise is the host the others reach this node at. Default:
	// Listen's host. The port is the bound gossip port.
	Advertise string
	// Key is the gossip encryption key, 16, 24 or 32 bytes: the cluster
	// secret's GossipKey. Required.
	Key []byte
	// Meta is the node's initial metadata; UpdateMeta changes it.
	Meta Meta
	// Local selects memberlist's timing for one machine (tests, local
	// jobs); the default is its LAN timing.
	Local bool
	// ProbeInterval and SuspicionMult, if set, override the timing preset:
	// how often a node probes another, and how many probe intervals a
	// suspected node has to refute it.
	ProbeInterval time.Duration
	SuspicionMult int
	// Forget is how long a dead or left member stays in All after this
	// node saw it go. Default DefaultForget. At most MaxGone such members
	// are kept in any case, the most recent ones.
	Forget time.Duration
	// Logger receives memberlist's log, at memberlist's levels.
	Logger zerolog.Logger
	// Block, for tests, cuts this node's gossip to the addresses it
	// reports true for, as a cut network would: packets to them are lost
	// and streams to them fail. A cut needs it on both sides. It is
	// called on memberlist's goroutines. Nil: nothing is cut.
	Block func(addr string) bool
}

// Node is this process's membership in the cluster.
type Node struct {
	name string
	ml   *memberlist.Memberlist
	del  *delegate
	ev   *events
	// flood logs refused connections and junk packets, rate-limited.
	flood *floodlog.Log
	// gossipInterval is memberlist's, for Leave.
	gossipInterval time.Duration
	logw           *logWriter
}

// Start binds the gossip address and starts gossiping, alone until Join.
func Start(cfg Config) (*Node, error) {
	if cfg.Name == "" {
		return nil, errors.New("membership: Name is required")
	}
	switch len(cfg.Key) {
	case 16, 24, 32:
	default:
		return nil, fmt.Errorf("membership: the gossip key must be 16, 24 or 32 bytes, got %d: give the cluster secret", len(cfg.Key))
	}
	host, port, err := splitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("membership: Listen %q: %w", cfg.Listen, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		return nil, fmt.Errorf("membership: Listen %q: bind an explicit address, such as 127.0.0.1", cfg.Listen)
	}
	adv := cfg.Advertise
	if adv == "" {
		adv = host
	}
	meta, err := cfg.Meta.MarshalBinary()
	if err != nil {
		return nil, err
	}
	mc := memberlist.DefaultLANConfig()
	// An alive message that misses a member when many join at once (more
	// likely the fewer times each broadcast is retransmitted) is repaired
	// only by the periodic full state exchange; until then the view cannot
	// admit the joiner. memberlist's 30 s (LAN) and 15 s (local) suit
	// clusters of thousands; a job has at most MaxView workers, whose full
	// state is a few tens of kilobytes.
	mc.PushPullInterval = 10 * time.Second
	if cfg.Local {
		mc = memberlist.DefaultLocalConfig()
		// Loopback has bandwidth to spare: retransmit as often as on a LAN,
		// and exchange state often.
		mc.RetransmitMult = 4
		mc.PushPullInterval = 2 * time.Second
	}
	mc.Name = cfg.Name
	mc.BindAddr, mc.BindPort = host, port
	mc.AdvertiseAddr, mc.AdvertisePort = adv, port // port 0: the bound one
	mc.SecretKey = cfg.Key
	mc.GossipVerifyIncoming, mc.GossipVerifyOutgoing = true, true
	// A worker that restarts at a new address under its old name may take
	// its name back at once.
	mc.DeadNodeReclaimTime = time.Nanosecond
	if cfg.ProbeInterval > 0 {
		mc.ProbeInterval = cfg.ProbeInterval
	}
	if cfg.SuspicionMult > 0 {
		mc.SuspicionMult = cfg.SuspicionMult
	}
	zl := cfg.Logger.With().Str("component", "membership").Logger()
	flood := floodlog.New(floodlog.Config{Logger: zl, What: "connections and packets to the gossip port"})
	lw := &logWriter{log: zl, flood: flood}
	mc.Logger = log.New(lw, "", 0)
	gt, err := newNetTransport(host, port, mc.Logger, flood, cfg.Block)
	if err != nil {
		flood.Close()
		return nil, fmt.Errorf("membership: start gossip on %s: %w", cfg.Listen, err)
	}
	// memberlist takes a given transport as bound: tell it the port.
	mc.Transport = gt
	mc.BindPort = gt.GetAutoBindPort()
	if mc.AdvertisePort == 0 {
		mc.AdvertisePort = mc.BindPort
	}
	forget := cfg.Forget
	if forget <= 0 {
		forget = DefaultForget
	}
	ev := newEvents(cfg.Name, forget, mc.RetransmitMult)
	d := &delegate{meta: meta, ev: ev}
	mc.Delegate, mc.Events, mc.Merge = d, ev, ev
	ml, err := memberlist.Create(mc)
	if err != nil {
		gt.Shutdown()
		flood.Close()
		return nil, fmt.Errorf("membership: start gossip on %s: %w", cfg.Listen, err)
	}
	return &Node{name: cfg.Name, ml: ml, del: d, ev: ev, flood: flood, gossipInterval: mc.GossipInterval, logw: lw}, nil
}

func splitHostPort(addr string) (string, int, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 0 || port > 65535 {
		return "", 0, fmt.Errorf("bad port %q", p)
	}
	return host, port, nil
}

// Addr returns the gossip address the others reach this node at: a seed
// address for later joiners.
func (n *Node) Addr() string {
	n.ev.mu.Lock()
	defer n.ev.mu.Unlock()
	if r := n.ev.members[n.name]; r != nil {
		return r.Addr
	}
	return ""
}

// seedErrors prints memberlist's list of per-seed join errors on one line.
type seedErrors struct{ list *multierror.Error }

func (e seedErrors) Error() string {
	msgs := make([]string, len(e.list.Errors))
	for i, err := range e.list.Errors {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (e seedErrors) Unwrap() []error { return e.list.Errors }

// oneLine returns err with a multierror's list printed on one line.
func oneLine(err error) error {
	var me *multierror.Error
	if errors.As(err, &me) && len(me.Errors) > 0 {
		return seedErrors{me}
	}
	return err
}

// Unreachable reports whether a Join error says that no seed was
// listening: every seed refused the connection. memberlist joins its
// per-seed errors as text, hence the match on the message.
func Unreachable(err error) bool {
	return err != nil && strings.Contains(err.Error(), "connection refused") &&
		!strings.Contains(err.Error(), "No installed keys could decrypt")
}

// Join contacts the seeds (host:port) and merges their view of the
// cluster. It returns once one seed answered, or ctx ends, or every seed
// failed; memberlist's own timeouts bound an attempt in progress.
func (n *Node) Join(ctx context.Context, seeds []string) error {
	if len(seeds) == 0 {
		return errors.New("membership: no seeds to join")
	}
	done := make(chan error, 1)
	go func() {
		_, err := n.ml.Join(seeds)
		done <- err
	}()
	select {
	case err := <-done:
		err = oneLine(err)
		if err != nil && Unreachable(err) {
			return fmt.Errorf("membership: join through %v: %w (nothing listens there: give the gossip address, --listen, of a live member)", seeds, err)
		}
		if err != nil {
			return fmt.Errorf("membership: join through %v: %w (a seed with another cluster secret cannot be joined)", seeds, err)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("membership: join through %v: %w", seeds, ctx.Err())
	}
}

// Member is one node as this node sees it.
type Member struct {
	Name string
	// Addr is its gossip address.
	Addr string
	Meta Meta
	// MetaErr says why Meta could not be read (another version, say).
	MetaErr error
	// State is the member's state; Since is when this node saw it begin.
	State State
	Since time.Time
}

// Members returns the live members (Alive or Suspect), this node
// included, in no particular order.
func (n *Node) Members() []Member {
	return n.ev.list(func(m *Member) bool { return m.State.Live() })
}

// All returns every member this node has seen, this node included, sorted
// by Name: the live ones and the dead and left ones it still remembers
// (see Config.Forget and MaxGone).
func (n *Node) All() []Member {
	ms := n.ev.list(func(*Member) bool { return true })
	slices.SortFunc(ms, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return ms
}

// UpdateMeta replaces this node's metadata and gossips it, waiting at most
// timeout for the update to be sent.
func (n *Node) UpdateMeta(m Meta, timeout time.Duration) error {
	b, err := m.MarshalBinary()
	if err != nil {
		return err
	}
	n.del.mu.Lock()
	n.del.meta = b
	n.del.mu.Unlock()
	return n.ml.UpdateNode(timeout)
}

// Leave tells the others that this node leaves, waiting at most timeout,
// then stops gossiping. Close stops without telling.
func (n *Node) Leave(timeout time.Duration) error {
	start := time.Now()
	// memberlist tells the others that a node left, not just died, but does
	// not pass that on to their event callbacks (hashicorp/memberlist#293),
	// so this node says so itself, in a notice gossiped beside memberlist's.
	n.ev.announceLeave()
	err := n.ml.Leave(timeout)
	if err == nil {
		// memberlist's Leave returns when its last copy of the message is
		// taken for sending, not sent; a Shutdown at once can close the
		// socket under it, and the peers then take the node for dead. So
		// give the packets two gossip rounds, as Serf's LeavePropagateDelay
		// does, within timeout.
		time.Sleep(min(2*n.gossipInterval, timeout-time.Since(start)))
	}
	err = errors.Join(err, n.ml.Shutdown())
	n.logw.closed.Store(true)
	n.flood.Close()
	return err
}

// Close stops gossiping at once; the others find the node dead.
func (n *Node) Close() error {
	err := n.ml.Shutdown()
	n.logw.closed.Store(true)
	n.flood.Close()
	return err
}
