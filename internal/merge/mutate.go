package merge

// mutate breaks the rules on purpose, for TestMutations: the simulator
// must catch each broken rule. All false outside that test.
var mutate struct {
	tiesYield bool // a view yields to one at the same iteration, whatever the leads
	liveOwn   bool // a view compares its live committed iteration, not its published one
}
