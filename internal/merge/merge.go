// Package merge decides how started views of one job (one cluster key and
// --job name) that meet in one gossip cluster become one: the protocol of
// docs/membership.md, "Merging started views". It is pure: what a member
// sees in gossip goes in, a verdict comes out, and the view's vote makes
// one verdict of its members' (Agree).
//
// A view is named by its lead, the smallest member ID its line has had
// (Own), and publishes its
// committed iteration in gossip from time to time. A view yields to a view
// that ranks above it: a higher published committed iteration, or the same
// with a smaller lead. Both sides compare published values, never a live
// one with a published one: a view's published iterations only grow, and
// what another member sees of them is one of them, so every yield goes to
// a view whose last published rank is above the yielder's. No chain of
// yields can then come back to where it started: some view always stays,
// and two views that see each other's latest values agree which one
// yields, however close their iterations (docs/membership.md).
package merge

import (
	"hash/fnv"
)

// Sight is a started view of the job, other than this worker's, as one
// member sees it in gossip: what its members last published.
type Sight struct {
	// Lead is the view's lead (Own.Lead).
	Lead string
	// Commit is the view's committed iteration, as published.
	Commit int64
}

// Own is this worker's view: its lead, and the committed iteration it
// last published (the same on every member: the view's vote decides when
// to publish).
//
// The lead is the smallest member ID the view's line has had: a view that
// loses its smallest member keeps its lead, so that its rank never falls
// (a tie at one iteration would otherwise go one way, then the other, and
// two views could yield to each other).
type Own struct {
	Lead      string
	Published int64
}

// Verdict is a member's, or its view's, decision about the views it
// meets: Yield is false to stay; else the view ends, and its members join
// the view named To (a LeadHash) as new members. Commit is that view's
// committed iteration as seen.
type Verdict struct {
	Yield  bool
	To     uint64
	Commit int64
}

// LeadHash names a view in vote records by its lead. It is never 0,
// which marks "none".
func LeadHash(lead string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(lead))
	if s := h.Sum64(); s != 0 {
		return s
	}
	return 1
}

// Above reports whether a view at commit with lead ranks above one at
// commit2 with lead2: a higher committed iteration, or the same and a
// smaller lead.
func Above(commit int64, lead string, commit2 int64, lead2 string) bool {
	if mutate.tiesYield {
		return commit >= commit2
	}
	return commit > commit2 || commit == commit2 && lead < lead2
}

// Judge is one member's verdict from what it sees of the other started
// views of its job: yield to the one that ranks highest, if it ranks above
// this view's published rank; else stay.
func Judge(own Own, seen []Sight) Verdict {
	var best *Sight
	for i := range seen {
		s := &seen[i]
		if s.Lead == own.Lead {
			continue // this view's own, under an old picture
		}
		if best == nil || Above(s.Commit, s.Lead, best.Commit, best.Lead) {
			best = s
		}
	}
	if best == nil || !Above(best.Commit, best.Lead, own.Published, own.Lead) {
		return Verdict{}
	}
	return Verdict{Yield: true, To: LeadHash(best.Lead), Commit: best.Commit}
}

// Agree makes the view's verdict of its members' (in rank order), as the
// boundary vote sees them: the lowest rank's yield, if any member yields.
// Every member judges the same table, so all act alike.
func Agree(verdicts []Verdict) Verdict {
	for _, v := range verdicts {
		if v.Yield {
			return v
		}
	}
	return Verdict{}
}
