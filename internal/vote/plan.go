package vote

import (
	"slices"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/transport"
)

// Input is what a boundary's plan is decided from: a table every member
// judged alike, and what every member holds alike.
type Input struct {
	// Iter is the iteration the boundary ends.
	Iter int64
	// Members, Joiners and Shares are the current view's members in rank
	// order, the joiners it first added, and its shares.
	Members []Member
	Joiners []transport.PeerID
	Shares  []int
	Recs    []Record
	// Known resolves the joiner hashes this worker listed.
	Known map[uint64]Member
	// BatchFit and MaxView bound the next view (DecideView).
	BatchFit, MaxView int
	// Checked says the boundary checked the state; NextCheck is the
	// iteration whose boundary checks it next, as the previous plan said.
	Checked   bool
	NextCheck int64
	// LBBSP says the shares follow the workers' models; Global is the
	// global batch and Balance the share decision's state.
	LBBSP   bool
	Global  int
	Balance balance.State
	// ReprobeEvery is how often, in iterations, the links are measured
	// again.
	ReprobeEvery int64
}

// Plan is what a boundary's table decided, before any of it is carried
// out. The engine decides, then does the plan's fallible I/O (a re-probe
// of the links, a view change), then applies it in one step, so that a
// boundary that fails leaves the iteration, shares, ring order and
// balance state as they were; the recovery that may follow starts from
// them.
type Plan struct {
	// Next is the iteration after the boundary.
	Next int64
	// View is the next view; View.Changed if it differs.
	View ViewDecision
	// Shares are the next shares, nil if kept, and Balance the balance
	// state that chose them; both LB-BSP only, with no view change.
	Shares  []int
	Balance balance.State
	// Kept, if not nil, says why LB-BSP kept the shares though every
	// worker had a model: no shares meet the table's bounds.
	Kept error
	// SpeedChanged says a worker's speed changed sharply.
	SpeedChanged bool
	// Reprobe says the links are measured again.
	Reprobe bool
	// NextCheck is the iteration whose boundary next checks the state.
	NextCheck int64
}

// Make decides a boundary's plan: the next view, shares and state check,
// the same on every member.
func Make(in Input) (Plan, error) {
	d, err := DecideView(in.Iter, in.Members, in.Recs, in.Known, in.BatchFit, in.MaxView)
	if err != nil {
		return Plan{}, err
	}
	PromoteJoiners(&d, in.Joiners)
	p := Plan{Next: in.Iter + 1, View: d, Balance: in.Balance, NextCheck: in.NextCheck}
	if in.Checked {
		p.NextCheck = in.Iter + CheckInterval(in.Recs)
	}
	if d.Changed {
		// The first boundary of a view checks the state, on every member:
		// a joiner, whose Join sets the same, has just received it.
		p.NextCheck = p.Next
		return p, nil
	}
	if in.LBBSP {
		p.Shares, p.Balance, p.SpeedChanged, p.Kept = Rebalance(in.Recs, in.Shares, in.Global, in.Balance)
	}
	p.Reprobe = p.Next%in.ReprobeEvery == 0
	return p, nil
}

// Rebalance decides the next shares from a boundary's table, the same on
// every member: nil if they stay, with the balance state that chose them.
// It waits until every worker has a model (a joiner's first iteration
// gives it one). A table no shares can satisfy keeps the shares and says
// why (kept), on every member.
func Rebalance(recs []Record, shares []int, global int, st balance.State) (next []int, ns balance.State, changed bool, kept error) {
	ws := Workers(recs)
	for _, rec := range recs {
		if !rec.Model.Known() {
			return nil, st, false, nil
		}
		changed = changed || rec.SpeedChanged
	}
	next, ns, err := balance.Step(balance.Params{}, st, ws, shares, global, changed)
	if err != nil {
		return nil, st, changed, err
	}
	if slices.Equal(next, shares) {
		return nil, ns, changed, nil
	}
	return next, ns, changed, nil
}

// Workers returns the table's models and share bounds, in rank order.
func Workers(recs []Record) []balance.Worker {
	ws := make([]balance.Worker, len(recs))
	for r, rec := range recs {
		ws[r] = balance.Worker{Model: rec.Model, Min: int(rec.MinShare), Max: int(rec.MaxShare)}
	}
	return ws
}
