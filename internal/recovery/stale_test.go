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
	if _, ok := a.Stale(Accept{Round: call.Round, Epoch: 3}); ok {
		t.Fatal("answered a message that is not a report")
	}
	notices := Notices(Installed{View: next, Lost: ids("c"), Winner: w})
	if len(notices) != 1 || notices[0].To != "c" || !Excluded("c", old, notices[0].Msg.(Install)) {
		t.Fatalf("the notices of an install without c are %+v; want one telling c it is out", notices)
	}
}
