package recovery

// Messages from ranks that run an older view. A rank the survivors
// excluded (it was stopped, starved or cut off past the peer timeout)
// wakes up in the view they left: its collectives fail, it starts a
// round, and it calls for reports from members that have moved on. They
// answer with an Install of the view they run: it is chosen, so a rank
// that finds itself outside it knows for certain that it is out, and
// rejoins as a new member instead of waiting for a majority that will
// never answer.

// Stale answers m, from a rank that may run an older view than the one
// this rank installed: a Report of an older installed epoch, or an
// Accept of a view of this rank's epoch or older (its sender missed the
// Install, and sends its Accept again while it waits), gets an Install
// of this rank's view, with the winner it started from. It changes
// nothing, so the runtime may call it while it trains or installs.
func (r *Rank) Stale(m Msg) (Install, bool) {
	switch m := m.(type) {
	case Report:
		if m.Installed.Epoch < r.installed.Epoch {
			return Install{Round: m.Round, View: r.installed.Clone(), Winner: r.installedWinner}, true
		}
	case Accept:
		if m.Epoch <= r.installed.Epoch && r.installed.Epoch > 0 {
			return Install{Round: m.Round, View: r.installed.Clone(), Winner: r.installedWinner}, true
		}
	}
	return Install{}, false
}

// Excluded reports whether m, an Install received by self while it runs
// installed, says that self is out of the job: m's view is newer and does
// not list it. An Install names a chosen view, and every later view
// descends from it, so self can come back only as a new member.
func Excluded(self ID, installed View, m Install) bool {
	return m.View.Epoch > installed.Epoch && !m.View.Has(self)
}

// Notices are what a rank that installed in tells the members in left
// out: the Install itself, which says they are out (Excluded). A lost
// rank that is dead never reads it; one that was only stopped or cut off
// reads it when it resumes, and rejoins instead of calling for reports
// nobody will answer.
func Notices(in Installed) []Send {
	out := make([]Send, 0, len(in.Lost))
	for _, id := range in.Lost {
		out = append(out, Send{To: id, Msg: Install{View: in.View.Clone(), Winner: in.Winner}})
	}
	return out
}
