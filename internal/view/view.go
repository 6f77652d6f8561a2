// Package view holds what belongs to one membership view: its members,
// this worker's rank, the shares, and the communicators and gradient
// fusers over it (View); and the links to the members that a view change
// connects, redials and forgets (Links).
package view

import (
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// View is everything that belongs to one membership view. Build makes
// it; a view change replaces it with one of a higher epoch.
type View struct {
	Epoch uint64
	// Members are the members in rank order with their data addresses;
	// IDs and Names are their transport IDs, and as strings.
	Members []vote.Member
	IDs     []transport.PeerID
	Names   []string
	Rank    int
	Shares  []int
	// Data carries gradients, the state broadcast and AllGather64.
	Data *ring.Comm
	// Ctrl carries the votes of Join and Boundary on its own channel, so
	// that a data collective cut off mid-message cannot leave them out of
	// step: every rank still learns the iteration's outcome.
	Ctrl *ring.Comm
	F32  *ring.Fuser[float32]
	F64  *ring.Fuser[float64]
	// Joiners are the members this view first added: they hold no state
	// of it yet, so they do not vote in a recovery from it.
	Joiners []transport.PeerID
	// order is the data ring's order (nil: rank order), a copy of the
	// data Comm's that RingOrder reads without waiting for a collective;
	// probed says the links have been probed.
	order  []int
	probed bool
}

// Channels of a view's communicators, for stall reports.
const (
	DataChannel    = "data"
	ControlChannel = "control"
)

// Builder builds views.
type Builder struct {
	T    transport.Transport
	Live *liveness.Monitor
	// Ring is the communicators' configuration but the view's own fields
	// (Epoch, Members, Rank, InitialBandwidth, Channel, OnStall).
	Ring ring.Config
	// Fuser configures the gradient fusers; Compress and AutoCompress
	// apply to the float32 one.
	Fuser ring.FuserConfig
	// OnStall, if set, returns the stall report of v's communicator on
	// channel (DataChannel or ControlChannel).
	OnStall func(v *View, channel string) func(ring.Stall)
}

// Build builds the communicators and gradient fusers of the view of
// members at epoch for the worker at rank, and watches the other members'
// heartbeats. bandwidth is the previous view's measured estimate (0 for
// none), so a new view does not start from the default.
func (b Builder) Build(epoch uint64, members []vote.Member, rank int, shares []int, bandwidth float64) (*View, error) {
	v := &View{Epoch: epoch, Members: slices.Clone(members), Rank: rank, Shares: slices.Clone(shares),
		IDs: vote.PeerIDs(members), Names: make([]string, len(members))}
	for i, m := range members {
		v.Names[i] = string(m.ID)
	}
	b.Live.Watch(slices.Delete(slices.Clone(v.IDs), rank, rank+1))
	rc := b.Ring
	rc.Epoch, rc.Members, rc.Rank, rc.InitialBandwidth = epoch, v.IDs, rank, bandwidth
	if b.OnStall != nil {
		rc.OnStall = b.OnStall(v, DataChannel)
	}
	var err error
	if v.Data, err = ring.NewComm(b.T, rc); err != nil {
		return nil, err
	}
	// The control channel's collectives are the boundary's, which the
	// observer hears of as boundaries.
	rc.Channel, rc.Observer, rc.OnStall = transport.ChanControl, nil, nil
	if b.OnStall != nil {
		rc.OnStall = b.OnStall(v, ControlChannel)
	}
	if v.Ctrl, err = ring.NewComm(b.T, rc); err != nil {
		v.Close()
		return nil, err
	}
	fc := b.Fuser
	fc.Compress, fc.AutoCompress = 0, false
	if v.F64, err = ring.NewFuser[float64](v.Data, fc); err != nil {
		v.Close()
		return nil, err
	}
	if v.F32, err = ring.NewFuser[float32](v.Data, b.Fuser); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}

// Close stops the view's fusers, failing their pending handles with
// ring.ErrClosed, and its communicators. The transport stays open.
func (v *View) Close() {
	if v.F32 != nil {
		v.F32.Close()
	}
	if v.F64 != nil {
		v.F64.Close()
	}
	if v.Data != nil {
		v.Data.Close()
	}
	if v.Ctrl != nil {
		v.Ctrl.Close()
	}
}

// Addrs returns the members' data addresses in rank order.
func (v *View) Addrs() []string {
	out := make([]string, len(v.Members))
	for i, m := range v.Members {
		out[i] = m.Addr
	}
	return out
}

// RankOf returns the rank of peer in the view, or -1.
func (v *View) RankOf(peer transport.PeerID) int { return slices.Index(v.IDs, peer) }

// Has reports whether peer is a member.
func (v *View) Has(peer transport.PeerID) bool { return v.RankOf(peer) >= 0 }

// Self is this worker's ID.
func (v *View) Self() transport.PeerID { return v.IDs[v.Rank] }

// Others returns the other members' IDs.
func (v *View) Others() []transport.PeerID {
	return slices.Delete(slices.Clone(v.IDs), v.Rank, v.Rank+1)
}

// Begun counts the collectives begun on the view's two communicators.
// Every rank runs the gradient buckets of an iteration and then its vote,
// in the same order, so the sum is a position in the epoch every rank
// passes through.
func (v *View) Begun() uint64 {
	var n uint64
	if v.Data != nil {
		n += v.Data.Started()
	}
	if v.Ctrl != nil {
		n += v.Ctrl.Started()
	}
	return n
}

// Probed is what a view's link probes chose: a ring order (nil: keep the
// current one), a cost model (nil: keep the current one), how long
// small collectives' receives poll (ring.Comm.SetPoll; nil: keep it),
// whether every data collective's receives poll, not only small ones'
// (ring.Comm.SetPollAll; nil: keep it), the data ring's pipeline chunk
// (ring.Comm.SetChunk; nil: keep it), and the machines with their
// models for the hierarchical allreduce, always run where it applies if
// HierarchyAlways (ring.Comm.SetHierarchy; applied with Model).
type Probed struct {
	Order           []int
	Model           *ring.CostModel
	Poll            *time.Duration
	PollAll         *bool
	Chunk           *int
	Hierarchy       *ring.Hierarchy
	HierarchyAlways bool
	// Stripes is the data channel's stripes (transport.Striper; nil:
	// keep them), applied by Links.SetStripes.
	Stripes *int
}

// RingOrder returns the view's ring order as ranks, rank order if none
// was chosen.
func (v *View) RingOrder() []int {
	if v.order == nil {
		return ring.RankOrder(len(v.IDs))
	}
	return slices.Clone(v.order)
}

// Ordered returns the ring order the probes chose, nil for rank order,
// and whether the links were probed for it.
func (v *View) Ordered() ([]int, bool) { return v.order, v.probed }

// SetProbed runs the view's ring in the order its link probes chose, if
// they chose one, with the cost model and the poll they gave, if any.
func (v *View) SetProbed(p Probed) error {
	if p.Order != nil {
		if err := v.Data.SetOrder(p.Order); err != nil {
			return err
		}
		v.order, v.probed = p.Order, true
	}
	if p.Poll != nil {
		if err := v.Data.SetPoll(*p.Poll); err != nil {
			return err
		}
		// The control channel's boundary votes are small collectives too.
		if err := v.Ctrl.SetPoll(*p.Poll); err != nil {
			return err
		}
	}
	if p.PollAll != nil {
		if err := v.Data.SetPollAll(*p.PollAll); err != nil {
			return err
		}
	}
	if p.Chunk != nil {
		if err := v.Data.SetChunk(*p.Chunk); err != nil {
			return err
		}
	}
	if p.Model != nil {
		if err := v.Data.SetCostModel(*p.Model); err != nil {
			return err
		}
		return v.Data.SetHierarchy(p.Hierarchy, p.HierarchyAlways)
	}
	return nil
}

// Hosts returns each member's host: its data address without the port,
// or the whole address if it has none (the in-memory transport's names).
func (v *View) Hosts() []string {
	out := make([]string, len(v.Members))
	for i, m := range v.Members {
		out[i] = hostOf(m.Addr)
	}
	return out
}
