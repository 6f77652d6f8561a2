package gyre

import (
	"math"
	"slices"

	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// viewState is everything that belongs to one membership view: the view,
// this worker's rank in it, the batch shares, and the collectives over it.
// newViewState is the one place it is built: Join uses it, and a view
// change at a boundary replaces the current one with a new one of a higher
// epoch.
type viewState struct {
	view    View
	ids     []transport.PeerID // view.Members as transport IDs
	members []member           // the same members with their data addresses
	rank    int
	shares  []int
	// data carries gradients, the state broadcast and AllGather64.
	data *ring.Comm
	// ctrl carries the votes of Join and Boundary on its own channel, so
	// that a data collective cut off mid-message cannot leave them out of
	// step: every rank still learns the iteration's outcome.
	ctrl *ring.Comm
	f32  *ring.Fuser[float32]
	f64  *ring.Fuser[float64]
	// order is the data ring's order (nil: rank order), a copy of the
	// data Comm's that View reads without waiting for a collective;
	// probed says the links have been probed (see arrangeRing).
	order  []int
	probed bool
	// joiners are the members this view first added: they hold no state
	// of it yet, so they do not vote in a recovery from it.
	joiners []transport.PeerID
}

// newViewState builds the communicators and gradient fusers of the view of
// members at epoch for the worker at rank. bandwidth is the previous
// view's measured estimate (0 for none), so a new view does not start from
// the default.
func (w *Worker) newViewState(epoch uint64, members []member, rank int, shares []int, bandwidth float64) (*viewState, error) {
	vs := &viewState{view: View{Epoch: epoch, Members: make([]string, len(members))},
		members: slices.Clone(members), rank: rank, shares: slices.Clone(shares)}
	vs.ids = make([]transport.PeerID, len(members))
	for i, m := range members {
		vs.ids[i], vs.view.Members[i] = m.ID, string(m.ID)
	}
	others := slices.Delete(slices.Clone(vs.ids), rank, rank+1)
	w.live.Watch(others)
	rc := w.ringConfig(vs, bandwidth)
	var err error
	if vs.data, err = ring.NewComm(w.t, rc); err != nil {
		return nil, err
	}
	// The control channel's collectives are the boundary's, which the
	// observer hears of as boundaries.
	rc.Channel, rc.Observer, rc.OnStall = transport.ChanControl, nil, w.onStall(vs, stallControl)
	if vs.ctrl, err = ring.NewComm(w.t, rc); err != nil {
		vs.close()
		return nil, err
	}
	fc := ring.FuserConfig{BucketBytes: w.cfg.BucketBytes}
	if bo, ok := w.observer.(ring.BucketObserver); ok {
		fc.Observer = bo
	}
	if vs.f64, err = ring.NewFuser[float64](vs.data, fc); err != nil {
		vs.close()
		return nil, err
	}
	fc.Compress, fc.AutoCompress = compressions[w.cfg.Compress], w.cfg.Compress == CompressAuto
	if vs.f32, err = ring.NewFuser[float32](vs.data, fc); err != nil {
		vs.close()
		return nil, err
	}
	return vs, nil
}

// close stops the view's fusers, failing their pending handles with
// ring.ErrClosed, and its communicators. The transport stays open.
func (vs *viewState) close() {
	if vs.f32 != nil {
		vs.f32.Close()
	}
	if vs.f64 != nil {
		vs.f64.Close()
	}
	if vs.data != nil {
		vs.data.Close()
	}
	if vs.ctrl != nil {
		vs.ctrl.Close()
	}
}

// addrs returns the members' data addresses in rank order.
func (vs *viewState) addrs() []string {
	out := make([]string, len(vs.members))
	for i, m := range vs.members {
		out[i] = m.Addr
	}
	return out
}

// rankOf returns the rank of peer in the view, or -1.
func (vs *viewState) rankOf(peer transport.PeerID) int {
	return slices.Index(vs.ids, peer)
}

// ringConfig is the configuration of vs's communicators.
func (w *Worker) ringConfig(vs *viewState, bandwidth float64) ring.Config {
	return ring.Config{Epoch: vs.view.Epoch, Members: vs.ids, Rank: vs.rank, Logger: w.plain,
		CollectiveTimeout: w.cfg.CollectiveTimeout, PeerTimeout: w.cfg.PeerTimeout, Liveness: w.live,
		InitialBandwidth: bandwidth, SmallBytes: smallBytes(w.cfg.Algo), Observer: w.observer,
		StallThreshold: max(w.cfg.StallThreshold, 0), OnStall: w.onStall(vs, stallData)}
}

// smallBytes is ring.Config.SmallBytes for Config.Algo.
func smallBytes(algo string) int {
	switch algo {
	case AlgoRing:
		return -1
	case AlgoDoubling:
		return math.MaxInt
	}
	return 0 // the cost model's threshold
}
