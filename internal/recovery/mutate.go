package recovery

// mutate switches off one safety rule each. Only tests set it, to show
// that the simulator catches the protocol without that rule.
var mutate struct {
	noMajority             bool // any voter is a majority
	installOnPropose       bool // install a proposal without waiting for Install
	adoptCoordinatorCommit bool // the coordinator's own commit wins
	ignorePrior            bool // propose afresh though a view of the next epoch was accepted
	greedyIgnoresHearing   bool // Greedy drops by unreachable peers only, not by who hears whom
}
