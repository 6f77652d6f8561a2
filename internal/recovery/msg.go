package recovery

import (
	"cmp"
	"fmt"
)

// Round numbers a recovery attempt. N grows by one per attempt; Coord is
// the attempt's coordinator. Two ranks that start attempt N with
// different coordinators start two rounds, not one: a round belongs to
// exactly one coordinator, so it proposes at most one view, which Paxos
// needs.
type Round struct {
	N     uint64
	Coord ID
}

// Cmp orders rounds by N, then by coordinator.
func (r Round) Cmp(s Round) int {
	if c := cmp.Compare(r.N, s.N); c != 0 {
		return c
	}
	return cmp.Compare(r.Coord, s.Coord)
}

func (r Round) String() string { return fmt.Sprintf("%d/%s", r.N, r.Coord) }

// Msg is one of Report, Propose, Accept and Install.
type Msg interface{ round() Round }

// Report is what a participant tells the coordinator. The coordinator
// sends its own Report to every member too: that is the call for reports.
type Report struct {
	Round Round
	From  ID
	Reach []ID // the members it hears, by its loss evidence

	// Installed is the view it runs in, whole: the coordinator may not
	// have installed it and needs its voters.
	Installed View
	// Accepted is the view of the highest round it accepted, with that
	// round and winner; it equals Installed if it accepted nothing since.
	Accepted       View
	AcceptedRound  Round
	AcceptedWinner Winner
	Commit         Commit
}

// Propose asks the reference view's voters that reported to accept View.
// Ref is the reference view it builds on: a rank accepts only a proposal
// built on the view it runs in, or on the one it accepted.
type Propose struct {
	Round  Round
	Ref    View
	View   View
	Lost   []ID
	Winner Winner
}

// Accept acknowledges a Propose.
type Accept struct {
	Round Round
	Epoch uint64
}

// Install announces a chosen view: a majority of the reference view's
// voters accepted it.
type Install struct {
	Round  Round
	View   View
	Winner Winner
}

func (m Report) round() Round  { return m.Round }
func (m Propose) round() Round { return m.Round }
func (m Accept) round() Round  { return m.Round }
func (m Install) round() Round { return m.Round }
