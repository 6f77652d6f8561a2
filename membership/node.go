package membership

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
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
	// Logger receives memberlist's log, at memberlist's levels.
	Logger zerolog.Logger
}

// Node is this process's membership in the cluster.
type Node struct {
	name string
	ml   *memberlist.Memberlist
	del  *delegate
	ev   *events
}

// events keeps this node's own copy of the members. memberlist's Members
// returns pointers into state its goroutines keep changing (a data race to
// read), while its event callbacks run under its lock, so copies made
// there are safe.
type events struct {
	mu      sync.Mutex
	members map[string]Member
}

func (e *events) set(n *memberlist.Node) {
	m := Member{Name: n.Name, Addr: n.Address()}
	m.MetaErr = m.Meta.UnmarshalBinary(n.Meta)
	e.mu.Lock()
	e.members[n.Name] = m
	e.mu.Unlock()
}

func (e *events) NotifyJoin(n *memberlist.Node)   { e.set(n) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.set(n) }
func (e *events) NotifyLeave(n *memberlist.Node) {
	e.mu.Lock()
	delete(e.members, n.Name)
	e.mu.Unlock()
}

// delegate serves this node's metadata to memberlist.
type delegate struct {
	mu   sync.Mutex
	meta []byte
}

func (d *delegate) NodeMeta(limit int) []byte {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.meta) > limit {
		return nil // checked against MaxMeta before it is set
	}
	return d.meta
}

func (d *delegate) NotifyMsg([]byte)                           {}
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *delegate) LocalState(join bool) []byte                { return nil }
func (d *delegate) MergeRemoteState(buf []byte, join bool)     {}

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
	if cfg.Local {
		mc = memberlist.DefaultLocalConfig()
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
	mc.Logger = log.New(&logWriter{log: cfg.Logger.With().Str("component", "membership").Logger()}, "", 0)
	d := &delegate{meta: meta}
	ev := &events{members: make(map[string]Member)}
	mc.Delegate, mc.Events = d, ev
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("membership: start gossip on %s: %w", cfg.Listen, err)
	}
	return &Node{name: cfg.Name, ml: ml, del: d, ev: ev}, nil
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
	return n.ev.members[n.name].Addr
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
}

// Members returns the live members (memberlist's alive and suspect nodes),
// this node included.
func (n *Node) Members() []Member {
	n.ev.mu.Lock()
	defer n.ev.mu.Unlock()
	out := make([]Member, 0, len(n.ev.members))
	for _, m := range n.ev.members {
		out = append(out, m)
	}
	return out
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
	err := n.ml.Leave(timeout)
	return errors.Join(err, n.ml.Shutdown())
}

// Close stops gossiping at once; the others find the node dead.
func (n *Node) Close() error { return n.ml.Shutdown() }

// logWriter turns memberlist's log lines ("[WARN] memberlist: ...") into
// zerolog events at the matching level.
type logWriter struct{ log zerolog.Logger }

func (w *logWriter) Write(p []byte) (int, error) {
	line := bytes.TrimSpace(p)
	level := zerolog.InfoLevel
	for prefix, l := range map[string]zerolog.Level{"[DEBUG]": zerolog.DebugLevel, "[INFO]": zerolog.InfoLevel,
		"[WARN]": zerolog.WarnLevel, "[ERR]": zerolog.ErrorLevel} {
		if rest, ok := bytes.CutPrefix(line, []byte(prefix)); ok {
			level, line = l, bytes.TrimSpace(rest)
			break
		}
	}
	w.log.WithLevel(level).Msg(string(bytes.TrimPrefix(line, []byte("memberlist: "))))
	return len(p), nil
}
