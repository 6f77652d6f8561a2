// Package vote holds the pure decisions of a boundary: the record every
// worker contributes to the vote's allgather and its encoding, the
// verdict on the gathered table, the next view (DecideView) and the plan
// of the boundary (MakePlan). Every worker holds the same table and runs
// the same code, so all reach the same outcome with no coordinator.
//
// It is pure: no goroutines, no I/O, no clock. The engine does the
// allgather, the barriers and the view changes around it.
package vote
