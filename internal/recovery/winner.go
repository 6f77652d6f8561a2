package recovery

import "cmp"

// Commit is the last state a rank committed: the iteration, the epoch of
// the view that committed it, and the state's digest.
type Commit struct {
	Epoch, Iter, Digest uint64
}

// Cmp orders commits by iteration, then by epoch. The digest does not
// order: equal iteration and epoch must mean equal state.
func (c Commit) Cmp(d Commit) int {
	if x := cmp.Compare(c.Iter, d.Iter); x != 0 {
		return x
	}
	return cmp.Compare(c.Epoch, d.Epoch)
}

// Winner is the committed state a new view starts from and the member
// that sends it.
type Winner struct {
	Holder ID
	Commit Commit
}

// ChooseWinner picks the highest commit held by a member of next, so
// that no member rolls back past a state it committed, and the lowest
// rank holding it sends it. commits maps members to what they reported.
// It fails if two holders of one iteration and epoch disagree on the
// digest: their states diverged and no copy can be trusted.
func ChooseWinner(next View, commits map[ID]Commit) (Winner, bool) {
	var w Winner
	found := false
	for _, m := range next.Members {
		if c, ok := commits[m]; ok && (!found || c.Cmp(w.Commit) > 0) {
			w, found = Winner{Holder: m, Commit: c}, true
		}
	}
	if divergedHolders(next, commits) != nil {
		return Winner{}, false
	}
	return w, found
}

// divergedHolders lists the members of next that hold the highest commit
// of any member, if they do not all agree on its digest; else nil.
func divergedHolders(next View, commits map[ID]Commit) []ID {
	var top Commit
	found := false
	for _, m := range next.Members {
		if c, ok := commits[m]; ok && (!found || c.Cmp(top) > 0) {
			top, found = c, true
		}
	}
	var holders []ID
	split := false
	for _, m := range next.Members {
		if c, ok := commits[m]; ok && c.Cmp(top) == 0 {
			holders = append(holders, m)
			split = split || c.Digest != top.Digest
		}
	}
	if !split {
		return nil
	}
	return holders
}
