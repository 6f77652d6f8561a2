package recovery

import "testing"

// TestStaleRankLearnsItIsOut: a rank the others recovered without calls
// for reports in its old view; a member's answer tells it that it is out,
// and a member that merely missed the install is not told so.
func TestStaleRankLearnsItIsOut(t *testing.T) {
	old := View{Epoch: 3, Members: ids("a", "b", "c", "d")}
	next := View{Epoch: 4, Members: ids("a", "b", "d")}
	w := Winner{Holder: "a", Commit: Commit{Epoch: 3, Iter: 9, Digest: 7}}
	a := NewRank("a", old, w.Commit, DefaultConfig)
	a.Advanced(next, w.Commit)
	call := Report{Round: Round{N: 1, Coord: "c"}, From: "c", Installed: old, Accepted: old}
	in, ok := a.Stale(call)
	if !ok || in.View.Epoch != 4 {
		t.Fatalf("a member answered a stale call with %+v, %v; want the install of epoch 4", in, ok)
	}
	if !Excluded("c", old, in) {
		t.Fatal("c, outside epoch 4, was not told it is out")
	}
	if Excluded("b", old, in) {
		t.Fatal("b, a member of epoch 4 that missed its install, was told it is out")
	}
	if _, ok := a.Stale(Report{Round: call.Round, From: "b", Installed: next, Accepted: next}); ok {
		t.Fatal("a member answered a report of its own epoch as stale")
	}
	// b accepted the proposal of epoch 4 and missed its Install: its
	// Accept, sent again, is answered with it.
	if in, ok := a.Stale(Accept{Round: call.Round, Epoch: 4}); !ok || in.View.Epoch != 4 {
		t.Fatalf("a late Accept of epoch 4 got %+v, %v; want the install of epoch 4", in, ok)
	}
	if _, ok := a.Stale(Accept{Round: call.Round, Epoch: 5}); ok {
		t.Fatal("answered an Accept of a view newer than the one installed")
	}
	if _, ok := a.Stale(Propose{Round: call.Round}); ok {
		t.Fatal("answered a proposal")
	}
	notices := Notices(Installed{View: next, Lost: ids("c"), Winner: w})
	if len(notices) != 1 || notices[0].To != "c" || !Excluded("c", old, notices[0].Msg.(Install)) {
		t.Fatalf("the notices of an install without c are %+v; want one telling c it is out", notices)
	}
}

// TestLostInstallIsResent: a participant that accepted and whose Install
// was lost sends its Accept again every ResendTicks; the coordinator,
// which installed and left its round, answers it with the Install
// (Stale). Without this the participant waited RoundTicks, which the
// runtime sets past the collective timeout, while the members that did
// install waited for it in the state transfer.
func TestLostInstallIsResent(t *testing.T) {
	v := View{Epoch: 1, Members: ids("a", "b", "c")}
	c0 := Commit{Epoch: 1, Iter: 5, Digest: 50}
	cfg := Config{CollectTicks: 1000, RoundTicks: 2000, ResendTicks: 3}
	ranks := map[ID]*Rank{"a": NewRank("a", v, c0, cfg), "b": NewRank("b", v, c0, cfg), "c": NewRank("c", v, c0, cfg)}
	type envelope struct {
		from, to ID
		msg      Msg
	}
	var pending []envelope
	post := func(from ID, outs []Output) {
		for _, o := range outs {
			if s, ok := o.(Send); ok {
				pending = append(pending, envelope{from: from, to: s.To, msg: s.Msg})
			}
		}
	}
	// Deliver everything, in order, but the Install to c.
	for _, id := range ids("a", "b", "c") {
		post(id, ranks[id].Step(Suspect{}))
	}
	for len(pending) > 0 {
		e := pending[0]
		pending = pending[1:]
		if _, ok := e.msg.(Install); ok && e.to == "c" {
			continue
		}
		post(e.to, ranks[e.to].Step(Recv{From: e.from, Msg: e.msg}))
	}
	if ranks["a"].Installed().Epoch != 2 || ranks["c"].Installed().Epoch != 1 || !ranks["c"].Recovering() {
		t.Fatalf("setup: a installed %d, c installed %d (recovering %v); want 2, and c waiting in epoch 1",
			ranks["a"].Installed().Epoch, ranks["c"].Installed().Epoch, ranks["c"].Recovering())
	}
	var resent *Accept
	for range cfg.ResendTicks {
		for _, o := range ranks["c"].Step(Tick{}) {
			if s, ok := o.(Send); ok && s.To == "a" {
				if acc, ok := s.Msg.(Accept); ok {
					resent = &acc
				}
			}
		}
	}
	if resent == nil {
		t.Fatalf("c did not send its Accept again within ResendTicks")
	}
	in, ok := ranks["a"].Stale(*resent)
	if !ok {
		t.Fatal("a, installed, did not answer c's late Accept")
	}
	ranks["c"].Step(Recv{From: "a", Msg: in})
	if got := ranks["c"].Installed(); got.Epoch != 2 || !got.Same(ranks["a"].Installed()) {
		t.Fatalf("c installed %+v after the resent Install; want a's epoch 2", got)
	}
}
