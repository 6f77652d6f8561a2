package recovery

// CanAccept decides whether a rank that installed installed and last
// accepted accepted may accept a proposal of view p built on the
// reference view ref (the round is checked by the caller). The proposal
// must build on the very view the rank runs in; or on the one it
// accepted, if it is a member of it, because the coordinator counts a
// rank only if its accepted view is the reference: then the rank first
// learns that view (learn). Comparing whole views, not epochs, keeps a
// rank from accepting a proposal built on another view of its epoch, and
// from "learning" a view of an epoch that was never chosen.
func CanAccept(self ID, installed, accepted, ref, p View) (learn, ok bool) {
	if p.Epoch != ref.Epoch+1 {
		return false, false
	}
	switch {
	case installed.Same(ref):
		return false, true
	case accepted.Same(ref) && accepted.Epoch == installed.Epoch+1 && accepted.Has(self):
		return true, true
	}
	return false, false
}
