package recovery

import (
	"slices"
	"testing"
)

func ids(s ...string) []ID {
	out := make([]ID, len(s))
	for i, x := range s {
		out[i] = ID(x)
	}
	return out
}

func TestMajority(t *testing.T) {
	v := View{Epoch: 3, Members: ids("a", "b", "c", "d", "e"), Joiners: ids("e"), Leavers: ids("d")}
	if got := v.Voters(); !slices.Equal(got, ids("a", "b", "c")) {
		t.Fatalf("Voters = %v", got)
	}
	for _, tc := range []struct {
		s    []ID
		want bool
	}{
		{ids("a", "b"), true},
		{ids("a", "d", "e"), false}, // joiners and leavers do not count
		{ids("a"), false},
		{ids("a", "b", "c", "x"), true},
		{nil, false},
	} {
		if got := v.Majority(tc.s); got != tc.want {
			t.Errorf("Majority(%v) = %v", tc.s, got)
		}
	}
	if (View{Members: ids("a", "b"), Joiners: ids("a", "b")}).Majority(ids("a", "b")) {
		t.Error("a view without voters gave a majority")
	}
	if (View{Members: ids("a", "b")}).Majority(ids("a")) {
		t.Error("half is a majority")
	}
}

func TestCoordinator(t *testing.T) {
	v := View{Members: ids("a", "b", "c", "d"), Leavers: ids("c")}
	for _, tc := range []struct {
		lost []ID
		n    uint64
		want ID
	}{
		{nil, 1, "a"},
		{ids("a"), 1, "b"},
		{nil, 2, "b"},
		{nil, 3, "d"}, // c leaves
		{nil, 4, "d"},
		{ids("d"), 4, "a"}, // wraps
		{nil, 5, "a"},
	} {
		if got, ok := Coordinator(v, tc.lost, tc.n); !ok || got != tc.want {
			t.Errorf("Coordinator(lost %v, round %d) = %v, %v; want %v", tc.lost, tc.n, got, ok, tc.want)
		}
	}
	if _, ok := Coordinator(v, ids("a", "b", "d"), 1); ok {
		t.Error("picked a coordinator with everyone lost")
	}
}

func TestGreedy(t *testing.T) {
	all := ids("a", "b", "c", "d")
	full := map[ID][]ID{"a": ids("b", "c", "d"), "b": ids("a", "c", "d"), "c": ids("a", "b", "d"), "d": ids("a", "b", "c")}
	if got := Greedy(all, full, true); !slices.Equal(got, all) {
		t.Fatalf("full reach kept %v", got)
	}
	oneWay := map[ID][]ID{"a": ids("b", "c", "d"), "b": ids("a", "c"), "c": ids("a", "b", "d"), "d": ids("a", "b", "c")}
	if got := Greedy(all, oneWay, true); !slices.Equal(got, ids("a", "b", "c")) {
		t.Fatalf("b does not hear d: kept %v, want the lower rank b", got)
	}
	star := map[ID][]ID{"a": ids("b", "c", "d"), "b": ids("a"), "c": ids("a"), "d": ids("a")}
	if got := Greedy(all, star, true); !slices.Equal(got, ids("a", "b")) {
		t.Fatalf("star kept %v", got)
	}
	// The reports of a real run: 3 of 5 (b, c, d) were stopped and
	// resumed; e, never stopped, does not hear b again yet. Everyone
	// hears e, so b goes, not e (the highest rank, on the old rule).
	five := ids("a", "b", "c", "d", "e")
	lagging := map[ID][]ID{"a": ids("b", "c", "d", "e"), "b": ids("a", "c", "d", "e"), "c": ids("a", "b", "d", "e"),
		"d": ids("a", "b", "c", "e"), "e": ids("a", "c", "d")}
	if got := Greedy(five, lagging, true); !slices.Equal(got, ids("a", "c", "d", "e")) {
		t.Fatalf("e does not hear b yet: kept %v, want b dropped, since everyone hears e", got)
	}
	if got := Greedy(five, lagging, false); !slices.Equal(got, ids("a", "b", "c", "d")) {
		t.Fatalf("by unreachable peers alone: kept %v, want e, the higher rank of the pair, dropped", got)
	}
}

func TestChooseWinner(t *testing.T) {
	next := View{Epoch: 4, Members: ids("a", "b", "c")}
	c7 := Commit{Epoch: 3, Iter: 7, Digest: 1}
	c8 := Commit{Epoch: 3, Iter: 8, Digest: 2}
	c8new := Commit{Epoch: 4, Iter: 8, Digest: 3}
	w, ok := ChooseWinner(next, map[ID]Commit{"a": c7, "b": c8, "c": c8, "x": {Iter: 99}})
	if !ok || w != (Winner{Holder: "b", Commit: c8}) {
		t.Fatalf("winner %+v, %v: want b's iteration 8, not the non-member's 99", w, ok)
	}
	if w, _ = ChooseWinner(next, map[ID]Commit{"a": c8, "c": c8new}); w.Holder != "c" {
		t.Fatalf("a later epoch wins a tie on iteration: %+v", w)
	}
	if _, ok = ChooseWinner(next, map[ID]Commit{"a": c8, "b": {Epoch: 3, Iter: 8, Digest: 9}}); ok {
		t.Fatal("diverged digests chose a winner")
	}
}

func TestCanAccept(t *testing.T) {
	v := func(e uint64, m ...string) View { return View{Epoch: e, Members: ids(m...)} }
	for _, tc := range []struct {
		name                     string
		installed, accepted, ref View
		p                        View
		learn, ok                bool
	}{
		{"next epoch", v(3, "a", "b"), v(3, "a", "b"), v(3, "a", "b"), v(4, "a"), false, true},
		{"replaces an accepted one", v(3, "a", "b"), v(4, "a", "b"), v(3, "a", "b"), v(4, "a"), false, true},
		{"builds on the accepted view", v(3, "a", "b"), v(4, "a", "b"), v(4, "a", "b"), v(5, "a"), true, true},
		{"accepted view without it", v(3, "a", "b"), v(4, "b"), v(4, "b"), v(5, "b"), false, false},
		{"old epoch", v(3, "a", "b"), v(3, "a", "b"), v(2, "a", "b"), v(3, "a"), false, false},
		{"too far", v(3, "a", "b"), v(3, "a", "b"), v(3, "a", "b"), v(5, "a"), false, false},
		// Another view of the rank's epoch: the proposal was not built on
		// what it runs in, nor on what it accepted.
		{"another view of its epoch", v(3, "a", "b"), v(3, "a", "b"), v(3, "a", "c"), v(4, "a"), false, false},
		{"learns only the accepted view itself", v(3, "a", "b"), v(4, "a", "b"), v(4, "a", "c"), v(5, "a"), false, false},
	} {
		learn, ok := CanAccept("a", tc.installed, tc.accepted, tc.ref, tc.p)
		if learn != tc.learn || ok != tc.ok {
			t.Errorf("%s: CanAccept = %v, %v; want %v, %v", tc.name, learn, ok, tc.learn, tc.ok)
		}
	}
}

func TestPlan(t *testing.T) {
	v3 := View{Epoch: 3, Members: ids("a", "b", "c", "d", "e")}
	rep := func(from string, reach []ID, c uint64) Report {
		return Report{From: ID(from), Reach: reach, Installed: v3, Accepted: v3, Commit: Commit{Epoch: 3, Iter: c}}
	}
	all := ids("a", "b", "c", "d", "e")
	reports := []Report{rep("b", all, 7), rep("c", all, 8), rep("d", all, 7)}
	p, to, ok := Plan("b", reports, true)
	if !ok || p.View.Epoch != 4 || !slices.Equal(p.View.Members, ids("b", "c", "d")) ||
		!slices.Equal(p.Lost, ids("a", "e")) || p.Winner.Holder != "c" || !slices.Equal(to, ids("b", "c", "d")) {
		t.Fatalf("Plan = %+v, %v, %v", p, to, ok)
	}
	if _, _, ok = Plan("b", reports[:2], true); ok {
		t.Fatal("2 of 5 proposed")
	}
	// d accepted a view for epoch 4 in round 2: it may have been chosen.
	prior := View{Epoch: 4, Members: ids("a", "b", "d")}
	reports[2].Accepted, reports[2].AcceptedRound, reports[2].AcceptedWinner = prior, Round{N: 2, Coord: "a"}, Winner{Holder: "a"}
	p, _, ok = Plan("b", reports, true)
	if !ok || !p.View.Same(prior) || p.Winner.Holder != "a" || !slices.Equal(p.Lost, ids("c", "e")) {
		t.Fatalf("did not re-propose the accepted view: %+v, %v", p, ok)
	}
	if _, _, ok = Plan("c", reports, true); ok {
		t.Fatal("c proposed a view it is not in")
	}
	// A report from a rank still on epoch 2 does not vote.
	reports[0].Installed = View{Epoch: 2, Members: all}
	reports[0].Accepted = reports[0].Installed
	if ref, _ := Reference(reports); len(Counted(ref, reports)) != 2 {
		t.Fatal("a rank on an older view was counted")
	}
}

// TestPlanNeedsTheCoordinatorCounted: a coordinator still on another view
// of the reference epoch (it accepted a view of epoch 2 that was not the
// one chosen) must not re-propose, even a view that holds it: it would
// then "learn" its own epoch-2 view, which nobody chose, and install it
// beside the chosen one.
func TestPlanNeedsTheCoordinatorCounted(t *testing.T) {
	v1 := View{Epoch: 1, Members: ids("a", "b", "c", "d")}
	v2 := View{Epoch: 2, Members: ids("a", "c", "d")}
	other2 := View{Epoch: 2, Members: ids("b", "c")}
	v3 := View{Epoch: 3, Members: ids("a", "c")}
	reports := []Report{
		{From: "a", Reach: ids("c", "d"), Installed: v2, Accepted: v3, AcceptedRound: Round{N: 4, Coord: "a"}, Commit: Commit{Epoch: 2, Iter: 5}},
		{From: "d", Reach: ids("a", "c"), Installed: v2, Accepted: v2, Commit: Commit{Epoch: 2, Iter: 5}},
		{From: "c", Reach: ids("a", "d"), Installed: v1, Accepted: other2, AcceptedRound: Round{N: 3, Coord: "b"}, Commit: Commit{Epoch: 1, Iter: 4}},
	}
	if p, _, ok := Plan("c", reports, true); ok {
		t.Fatalf("c, on another view of epoch 2, proposed %+v", p)
	}
	p, _, ok := Plan("a", reports, true)
	if !ok || !p.View.Same(v3) || !p.Ref.Same(v2) {
		t.Fatalf("a, counted, proposed %+v (%v); want the prior view %v on %v", p, ok, v3, v2)
	}
	if _, ok := CanAccept("c", v1, other2, p.Ref, p.View); ok {
		t.Fatal("c accepted a proposal built on a view of its epoch it does not hold")
	}
}

// TestDivergedIsTerminal: holders of one commit with different digests
// end the recovery for good (Waiting with Diverged), rather than fail
// the same proposal round after round.
func TestDivergedIsTerminal(t *testing.T) {
	v := View{Epoch: 1, Members: ids("a", "b", "c")}
	a := NewRank("a", v, Commit{Epoch: 1, Iter: 7, Digest: 70}, DefaultConfig)
	rd := Round{N: 1, Coord: "a"}
	rep := func(from string, d uint64) Report {
		return Report{Round: rd, From: ID(from), Reach: ids("a", "b", "c"), Installed: v, Accepted: v,
			Commit: Commit{Epoch: 1, Iter: 8, Digest: d}}
	}
	if outs := a.Step(Recv{From: "b", Msg: rep("b", 80)}); slices.ContainsFunc(outs, func(o Output) bool { _, ok := o.(Waiting); return ok }) {
		t.Fatalf("gave up before c reported: %+v", outs)
	}
	var got []ID
	for _, o := range a.Step(Recv{From: "c", Msg: rep("c", 81)}) {
		if w, ok := o.(Waiting); ok {
			got = w.Diverged
		}
	}
	if !slices.Equal(got, ids("b", "c")) {
		t.Fatalf("Diverged = %v, want b and c", got)
	}
	for range DefaultConfig.RoundTicks + 1 {
		if outs := a.Step(Tick{}); len(outs) > 0 {
			t.Fatalf("a diverged rank went on: %+v", outs)
		}
	}
	// The same reports with one digest make a proposal, and no Diverged.
	a = NewRank("a", v, Commit{Epoch: 1, Iter: 7, Digest: 70}, DefaultConfig)
	a.Step(Recv{From: "b", Msg: rep("b", 80)})
	for _, o := range a.Step(Recv{From: "c", Msg: rep("c", 80)}) {
		if w, ok := o.(Waiting); ok {
			t.Fatalf("agreeing holders: %+v", w)
		}
	}
	if !a.Recovering() {
		t.Fatal("no round")
	}
}

// TestCoordinatorDecidesOnEvidence: a coordinator holding a majority's
// reports proposes as soon as evidence says the members it still waited
// for are gone, not after CollectTicks (the collective timeout in the
// runtime). A real job waited its whole quorum timeout this way when the
// evidence of a dead member came after the survivors' reports.
func TestCoordinatorDecidesOnEvidence(t *testing.T) {
	v := View{Epoch: 1, Members: ids("a", "b", "c", "d", "e")}
	cfg := Config{CollectTicks: 1 << 20, RoundTicks: 1<<20 + 100}
	a := NewRank("a", v, Commit{Epoch: 1, Iter: 7, Digest: 70}, cfg)
	a.Step(Lost{Peer: "e"}) // round 1, coordinated by a
	rd := Round{N: 1, Coord: "a"}
	proposed := func(outs []Output) bool {
		return slices.ContainsFunc(outs, func(o Output) bool {
			s, ok := o.(Send)
			if !ok {
				return false
			}
			_, ok = s.Msg.(Propose)
			return ok
		})
	}
	for _, from := range []string{"b", "c"} {
		rep := Report{Round: rd, From: ID(from), Reach: ids("a", "b", "c"), Installed: v, Accepted: v,
			Commit: Commit{Epoch: 1, Iter: 7, Digest: 70}}
		if outs := a.Step(Recv{From: ID(from), Msg: rep}); proposed(outs) {
			t.Fatalf("proposed while d, heard and not reported, might still report: %+v", outs)
		}
	}
	for range 10 {
		if outs := a.Step(Tick{}); proposed(outs) {
			t.Fatal("proposed on a tick, before CollectTicks, with d unreported")
		}
	}
	if outs := a.Step(Lost{Peer: "d"}); !proposed(outs) {
		t.Fatalf("evidence against d, the last member awaited, made no proposal: %+v", outs)
	}
}
