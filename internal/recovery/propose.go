package recovery

import "slices"

// Coordinator picks the coordinator of round n from ref: the member of
// rank (n-1) mod |ref|, or the next one up (wrapping) that is not in lost
// and is not leaving. So round 1 takes the lowest rank it hears, and a
// rank that loses the coordinator or times out moves to round n+1 and
// the next rank. Ranks that start a round independently agree on its
// coordinator as long as they agree on n, which they learn from each
// other's messages; a choice on each rank's own history would let them
// chase each other round after round.
func Coordinator(ref View, lost []ID, n uint64) (ID, bool) {
	k := len(ref.Members)
	if k == 0 {
		return "", false
	}
	start := int((max(n, 1) - 1) % uint64(k))
	for i := range k {
		m := ref.Members[(start+i)%k]
		if !slices.Contains(lost, m) && !slices.Contains(ref.Leavers, m) {
			return m, true
		}
	}
	return "", false
}

// Reference is the view a round counts its majority in: the highest
// view any reporter installed. An installed view was chosen, so there is
// one per epoch. A view only accepted may never have been chosen; counting
// in it could let two disjoint groups each build on a view of their own.
func Reference(reports []Report) (View, bool) {
	var ref View
	found := false
	for _, r := range reports {
		if !found || r.Installed.Epoch > ref.Epoch {
			ref, found = r.Installed, true
		}
	}
	return ref, found
}

// Counted keeps the reports that vote in a round whose reference is ref:
// those of members of ref that installed ref, or accepted ref without yet
// hearing it was installed. A rank on an older view never votes.
func Counted(ref View, reports []Report) []Report {
	var out []Report
	for _, r := range reports {
		if ref.Has(r.From) && (r.Installed.Epoch == ref.Epoch || r.Accepted.Same(ref)) &&
			!slices.ContainsFunc(out, func(o Report) bool { return o.From == r.From }) {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(a, b Report) int { return ref.Rank(a.From) - ref.Rank(b.From) })
	return out
}

// Greedy keeps, of the candidates (in rank order), a set in which every
// pair reaches each other both ways. While a pair does not, it drops a
// member of such a pair: with byHearing the one the fewest kept members
// reach, then the one with the most unreachable peers, then the highest
// rank; without, the last two rules only. byHearing is minimal
// exclusion: a member the others hear is not dropped because a peer does
// not hear it back yet (a peer just resumed from a stop, whose evidence
// lags); the peer that fewer hear goes instead.
func Greedy(candidates []ID, reach map[ID][]ID, byHearing bool) []ID {
	keep := slices.Clone(candidates)
	both := func(a, b ID) bool {
		return slices.Contains(reach[a], b) && slices.Contains(reach[b], a)
	}
	for {
		worst, fewest, most := -1, 0, 0
		for i, a := range keep {
			n, heard := 0, 0
			for _, b := range keep {
				if a == b {
					continue
				}
				if !both(a, b) {
					n++
				}
				if slices.Contains(reach[b], a) {
					heard++
				}
			}
			if n == 0 {
				continue
			}
			if !byHearing {
				heard = 0
			}
			if worst < 0 || heard < fewest || heard == fewest && n >= most {
				worst, fewest, most = i, heard, n
			}
		}
		if worst < 0 {
			return keep
		}
		keep = slices.Delete(keep, worst, worst+1)
	}
}

// Chosen finds a view of the epoch after the reference that the reports
// prove chosen: its acceptors in one round, with that round's coordinator
// (which accepts its own proposal before anyone else can), hold a
// majority of the reference's voters. Such a view may be installed at
// once, even by a minority of the reference, which could never make a
// proposal of its own; without this, ranks that missed the Install of a
// view whose installer was then cut off wait for ever.
func Chosen(reports []Report) (Install, bool) {
	ref, found := Reference(reports)
	if !found {
		return Install{}, false
	}
	counted := Counted(ref, reports)
	for _, r := range counted {
		if r.Accepted.Epoch != ref.Epoch+1 {
			continue
		}
		acceptors := []ID{r.AcceptedRound.Coord}
		for _, o := range counted {
			if o.AcceptedRound == r.AcceptedRound && o.Accepted.Same(r.Accepted) && !slices.Contains(acceptors, o.From) {
				acceptors = append(acceptors, o.From)
			}
		}
		if ref.Majority(acceptors) {
			return Install{Round: r.AcceptedRound, View: r.Accepted.Clone(), Winner: r.AcceptedWinner}, true
		}
	}
	return Install{}, false
}

// Plan is what the coordinator self of a round proposes, given the
// reports it holds (its own among them), and to whom: the counted
// reporters, who all may accept though not all may be kept. ok is false
// if the round cannot propose: no majority of the reference view reported,
// the kept members hold no majority, the coordinator is not kept, or
// holders of one commit disagree on its digest. settled says the round's
// evidence has stopped changing (fresh).
func Plan(self ID, reports []Report, settled bool) (p Propose, to []ID, ok bool) {
	ref, found := Reference(reports)
	if !found {
		return Propose{}, nil, false
	}
	counted := Counted(ref, reports)
	for _, r := range counted {
		to = append(to, r.From)
	}
	if !ref.Majority(to) {
		return Propose{}, nil, false
	}
	// Paxos: a view accepted for the next epoch may have been chosen; the
	// one of the highest round is the only one that may have been.
	var prior *Report
	for i, r := range counted {
		if r.Accepted.Epoch == ref.Epoch+1 && (prior == nil || r.AcceptedRound.Cmp(prior.AcceptedRound) > 0) {
			prior = &counted[i]
		}
	}
	if prior != nil && !mutate.ignorePrior {
		// The coordinator must be counted itself, as on the fresh path:
		// one on another view of the reference epoch must not propose.
		if !prior.Accepted.Has(self) || !slices.Contains(to, self) {
			return Propose{}, nil, false
		}
		return Propose{Ref: ref.Clone(), View: prior.Accepted.Clone(), Lost: LostFrom(ref, prior.Accepted), Winner: prior.AcceptedWinner}, to, true
	}
	next, commits := fresh(ref, counted, settled)
	if !next.Has(self) || !ref.Majority(next.Members) {
		return Propose{}, nil, false
	}
	w, ok := ChooseWinner(next, commits)
	if !ok {
		return Propose{}, nil, false
	}
	if mutate.adoptCoordinatorCommit {
		w = Winner{Holder: self, Commit: commits[self]}
	}
	return Propose{Ref: ref.Clone(), View: next, Lost: LostFrom(ref, next), Winner: w}, to, true
}

// fresh is the view the coordinator self proposes when no view of the
// next epoch was accepted: the counted reporters that are not leaving,
// less those the greedy rule drops; and the commits they reported. The
// rule drops by who hears whom first (minimal exclusion). If that leaves
// no majority of ref's voters, it drops by unreachable peers alone, but
// only once the evidence has settled: until then the evidence of members
// that just heard the others again may catch up (a member all hear, its
// own evidence lagging, would be dropped). A joiner, which does not vote,
// may be the one all hear. A coordinator the rule drops proposes
// nothing, and the next round's may.
func fresh(ref View, counted []Report, settled bool) (View, map[ID]Commit) {
	var cands []ID
	reach := map[ID][]ID{}
	commits := map[ID]Commit{}
	for _, r := range counted {
		if slices.Contains(ref.Leavers, r.From) {
			continue // a recovery is a boundary: leavers leave
		}
		cands = append(cands, r.From)
		reach[r.From] = r.Reach
		commits[r.From] = r.Commit
	}
	keep := Greedy(cands, reach, !mutate.greedyIgnoresHearing)
	if !ref.Majority(keep) && settled {
		keep = Greedy(cands, reach, false)
	}
	return View{Epoch: ref.Epoch + 1, Members: keep}, commits
}

// Diverged lists the members that would make the fresh proposal of the
// coordinator self fail because they hold the highest commit with
// different digests (ChooseWinner), or nil if Plan fails, or succeeds,
// for any other reason. Such a failure is terminal: no later round can
// mend it.
func Diverged(self ID, reports []Report) []ID {
	ref, found := Reference(reports)
	if !found {
		return nil
	}
	counted := Counted(ref, reports)
	var to []ID
	for _, r := range counted {
		to = append(to, r.From)
		if r.Accepted.Epoch == ref.Epoch+1 && !mutate.ignorePrior {
			return nil // a re-proposal carries its winner
		}
	}
	if !ref.Majority(to) {
		return nil
	}
	next, commits := fresh(ref, counted, true)
	if !next.Has(self) || !ref.Majority(next.Members) {
		return nil
	}
	return divergedHolders(next, commits)
}
