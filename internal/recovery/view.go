package recovery

import "slices"

// ID is a member's transport ID.
type ID string

// View is one membership of the job. Members are in rank order.
type View struct {
	Epoch   uint64
	Members []ID
	Joiners []ID // members first added by this view
	Leavers []ID // members whose boundary record asked to leave
}

// Voters are the members that count towards a majority: joiners hold no
// state of this view yet, leavers are on their way out.
func (v View) Voters() []ID {
	var out []ID
	for _, m := range v.Members {
		if !slices.Contains(v.Joiners, m) && !slices.Contains(v.Leavers, m) {
			out = append(out, m)
		}
	}
	return out
}

// Majority reports whether s holds strictly more than half of v's voters.
// With no voters nothing has a majority: an empty view elects nobody.
func (v View) Majority(s []ID) bool {
	voters := v.Voters()
	n := 0
	for _, m := range voters {
		if slices.Contains(s, m) {
			n++
		}
	}
	if mutate.noMajority {
		return n > 0
	}
	return len(voters) > 0 && 2*n > len(voters)
}

// Rank is m's rank in v, or -1.
func (v View) Rank(m ID) int { return slices.Index(v.Members, m) }

// Has reports whether m is a member of v.
func (v View) Has(m ID) bool { return v.Rank(m) >= 0 }

// Same reports whether v and w are the same view: one epoch, one member
// list, the same joiners and leavers.
func (v View) Same(w View) bool {
	return v.Epoch == w.Epoch && slices.Equal(v.Members, w.Members) &&
		slices.Equal(v.Joiners, w.Joiners) && slices.Equal(v.Leavers, w.Leavers)
}

// Clone returns a copy of v that shares no slices with it, so that a
// message and the state of its sender never alias.
func (v View) Clone() View {
	return View{Epoch: v.Epoch, Members: slices.Clone(v.Members),
		Joiners: slices.Clone(v.Joiners), Leavers: slices.Clone(v.Leavers)}
}

// LostFrom lists the voters of ref that next does not keep, in ref's rank
// order: the ranks every member of next names lost.
func LostFrom(ref, next View) []ID {
	var out []ID
	for _, m := range ref.Voters() {
		if !next.Has(m) {
			out = append(out, m)
		}
	}
	return out
}
