package recovery

// CanAccept decides whether a rank that installed installed and last
// accepted accepted may accept a proposal of view p (the round is checked
// by the caller). A proposal builds on the installed view; or on the
// accepted one, if the rank is a member of it, because the coordinator
// builds only on an installed view and counts the rank only if its
// accepted view is that one: then the rank first learns that view
// (learn).
func CanAccept(self ID, installed, accepted, p View) (learn, ok bool) {
	switch {
	case p.Epoch == installed.Epoch+1:
		return false, true
	case p.Epoch == installed.Epoch+2 && accepted.Epoch == installed.Epoch+1 && accepted.Has(self):
		return true, true
	}
	return false, false
}
