package view

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/config"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/quic"
	"github.com/gyre-ml/gyre/transport/tcp"
)

// Links are a worker's links to the members of its views, over its
// transport: which peer was dialled at which address, so that a member
// back under its ID at another address is dialled afresh. Links is used
// from the worker's goroutine only.
type Links struct {
	T transport.Transport
	// Own says the worker built T, rather than being given it: only
	// then may it linger before closing it (ConnectView).
	Own bool
	Log zerolog.Logger
	// dialled is the address each peer was connected at.
	dialled map[transport.PeerID]string
}

// NewLinks returns the links of a worker over t.
func NewLinks(t transport.Transport, own bool, log zerolog.Logger) *Links {
	return &Links{T: t, Own: own, Log: log, dialled: map[transport.PeerID]string{}}
}

const (
	connectAttempt = 2 * time.Second
	connectRetry   = 100 * time.Millisecond
)

// refusedLinger is how long ConnectView lingers after a refusal: long
// enough for peers that retry every connectRetry to dial again.
const refusedLinger = 3 * time.Second

// ConnectView connects to every member of v, naming one whose secret
// differs; then, if it built its transport, it lingers reachable for a
// while, so that the peers dialling it are refused in turn and name it,
// instead of retrying a closed port until their JoinTimeout.
func (l *Links) ConnectView(ctx context.Context, v *View) error {
	err := l.Connect(ctx, v.IDs, v.Addrs(), v.Rank)
	if errors.Is(err, transport.ErrUnauthenticated) && l.Own {
		l.Log.Warn().Dur("for", refusedLinger).Msg("a peer refused this worker's certificate; staying reachable so the peers learn why")
		select {
		case <-time.After(refusedLinger):
		case <-ctx.Done():
		}
	}
	return err
}

// Connect is ConnectMembers, first dropping every member that the
// transport holds at an address other than addrs gives, a worker back
// under its ID at a new address: Connect would otherwise return the old,
// dead link.
func (l *Links) Connect(ctx context.Context, ids []transport.PeerID, addrs []string, rank int) error {
	for i, id := range ids {
		if i != rank {
			l.RedialIfMoved(id, addrs[i])
		}
	}
	if err := ConnectMembers(ctx, l.T, ids, addrs, rank); err != nil {
		return err
	}
	for i, id := range ids {
		if i != rank {
			l.dialled[id] = addrs[i]
		}
	}
	return nil
}

// DialJoiner connects to a joiner at addr, to welcome it, retrying while
// it starts, until ctx ends. A worker back after the job recovered
// without it may have left streams here since this member forgot it (an
// abort marker it sent on resuming, say, that nothing has read): marked
// left behind, they give way to its streams of the new view instead of
// ending in a failed receive when it closes them.
func (l *Links) DialJoiner(ctx context.Context, peer transport.PeerID, addr string) error {
	l.RedialIfMoved(peer, addr)
	l.Reopen([]transport.PeerID{peer})
	if err := connectPeer(ctx, l.T, peer, addr, nil); err != nil {
		return err
	}
	l.dialled[peer] = addr
	return nil
}

// RedialIfMoved drops id if the transport holds it at an address other
// than addr, so that the next Connect dials addr.
func (l *Links) RedialIfMoved(id transport.PeerID, addr string) {
	prev, ok := l.dialled[id]
	if !ok || prev == addr {
		return
	}
	l.Log.Info().Str("peer", string(id)).Str("was", prev).Str("now", addr).Msg("member is back at a new address; dialling it afresh")
	if f, ok := l.T.(transport.Forgetter); ok {
		f.Forget(id)
	} else if d, ok := l.T.(transport.Dropper); ok {
		d.Drop(id, errMoved)
	}
	delete(l.dialled, id)
}

var errMoved = errors.New("gyre: the member is back at another address")

// Forget drops every record the transport holds of peers, and forgets
// where they were dialled.
func (l *Links) Forget(peers []transport.PeerID) {
	f, _ := l.T.(transport.Forgetter)
	for _, p := range peers {
		if f != nil {
			f.Forget(p)
		}
		delete(l.dialled, p)
	}
}

// Reopen closes this side's data and control streams to peers
// (transport.Reopener): the next send opens new ones, and a peer still
// reading the old ones sees them end.
func (l *Links) Reopen(peers []transport.PeerID) {
	ro, ok := l.T.(transport.Reopener)
	if !ok {
		return
	}
	for _, id := range peers {
		ro.Reopen(id, transport.ChanData)
		ro.Reopen(id, transport.ChanControl)
	}
}

// SetStripes stripes the data channel to peers over k connections each
// (transport.Striper), and reopens it, as every member of the view does
// at the same point: after the link probes that chose k, before any of
// them sends data again. The channel is idle then: each member gathered
// the probe table only after its last collective ended. It reopens even
// if k is this side's count already: the reopen tells this side's
// receives to wait for the peers' new streams, which they open whether
// or not their own count changed. It does nothing on a transport that
// cannot stripe.
func (l *Links) SetStripes(k int, peers []transport.PeerID) error {
	st, ok := l.T.(transport.Striper)
	if !ok {
		return nil
	}
	if err := st.SetStripes(transport.ChanData, k); err != nil {
		return err
	}
	if ro, ok := l.T.(transport.Reopener); ok {
		for _, id := range peers {
			ro.Reopen(id, transport.ChanData)
		}
	}
	return nil
}

// ConnectMembers connects t to every member but members[rank], each at
// its address in addrs, retrying while they start, until ctx ends. A
// member that refuses this worker's credentials fails it at once, and so
// does one whose own connection this transport refused
// (transport.RefusalReporter), even if it has gone since: the cluster
// secrets differ, and waiting would not help.
func ConnectMembers(ctx context.Context, t transport.Transport, members []transport.PeerID, addrs []string, rank int) error {
	for i, m := range members {
		if i == rank {
			continue
		}
		var refusal error // names the refused member itself, which need not be rank i
		refused := func() error {
			refusal = refusedMember(t, members, addrs, rank)
			return refusal
		}
		if err := connectPeer(ctx, t, m, addrs[i], refused); err != nil {
			if refusal != nil {
				return refusal
			}
			return fmt.Errorf("gyre: rank %d connecting to rank %d (%s at %s): %w", rank, i, m, addrs[i], err)
		}
	}
	return nil
}

// connectPeer connects t to peer at addr, retrying while it starts, until
// ctx ends. A peer that refuses this worker's credentials fails it at
// once, and so does refused's error, if refused is given.
func connectPeer(ctx context.Context, t transport.Transport, peer transport.PeerID, addr string, refused func() error) error {
	for {
		if refused != nil {
			if err := refused(); err != nil {
				return err
			}
		}
		cctx, cancel := context.WithTimeout(ctx, connectAttempt)
		err := t.Connect(cctx, peer, addr)
		cancel()
		switch {
		case err == nil:
			return nil
		case errors.Is(err, transport.ErrUnauthenticated):
			return fmt.Errorf("the cluster secrets differ: %w", err)
		case ctx.Err() != nil:
			return err
		}
		select {
		case <-time.After(connectRetry):
		case <-ctx.Done():
			// Both wrapped: a member that never answered is a lost peer
			// to a view change, which recovers from it.
			return fmt.Errorf("%w (last attempt: %w)", ctx.Err(), err)
		}
	}
}

// refusedMember returns an error naming the first member, other than rank,
// whose connection t refused for its certificate, or nil.
func refusedMember(t transport.Transport, members []transport.PeerID, addrs []string, rank int) error {
	rr, ok := t.(transport.RefusalReporter)
	if !ok {
		return nil
	}
	for _, ref := range rr.Refusals() {
		for i, m := range members {
			if i != rank && (ref.Claimed == m || ref.Remote == addrs[i]) {
				return fmt.Errorf("gyre: rank %d: rank %d (%s) connected with a certificate this cluster's CA did not issue: the cluster secrets differ: %w",
					rank, i, m, ref.Err)
			}
		}
	}
	return nil
}

// hostOf returns addr without its port, or addr if it has none.
func hostOf(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}

// NewTransport validates cfg and builds the data-plane transport it asks
// for, listening on cfg.DataAddr (gyre.NewTransport). It loads the
// cluster secret, derives the cluster CA and mints this worker's leaf
// certificate for cfg.Name.
func NewTransport(cfg config.Config) (transport.Transport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if !cfg.HasSecret() {
		return nil, fmt.Errorf("%w: %v", config.ErrConfig, config.ErrNoSecret)
	}
	cfg = cfg.WithDefaults()
	lim := wire.DefaultLimits()
	lim.MaxFrame = uint32(cfg.MaxFrame)
	id := transport.PeerID(cfg.Name)
	shm := cfg.SharedMemory == config.SharedMemoryAuto
	if cfg.Insecure {
		// Validate allows Insecure only with tcp.
		return tcp.New(tcp.Config{ID: id, Insecure: true, Listen: cfg.DataAddr, Limits: lim,
			Stripes: max(cfg.Stripes, 1), SharedMemory: shm, Logger: cfg.Log()})
	}
	key, err := cfg.Secret()
	if err != nil {
		return nil, fmt.Errorf("gyre: cluster secret: %w", err)
	}
	ca, err := key.CA()
	if err != nil {
		return nil, err
	}
	ident, err := ca.Issue(cfg.Name)
	if err != nil {
		return nil, err
	}
	if cfg.Transport == config.TransportTCP {
		return tcp.New(tcp.Config{ID: id, Identity: ident, Listen: cfg.DataAddr, Limits: lim,
			Stripes: max(cfg.Stripes, 1), SharedMemory: shm, Logger: cfg.Log()})
	}
	// A reset key that is the same on every run lets a restarted worker
	// reset its peers' stale connections at once.
	resetKey := key.ResetKey(cfg.Name)
	return quic.New(quic.Config{ID: id, Identity: ident, Listen: cfg.DataAddr, Limits: lim,
		Stripes: max(cfg.Stripes, 1), SharedMemory: shm, Logger: cfg.Log(), ResetKey: &resetKey})
}
