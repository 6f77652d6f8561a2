// Package recovery decides how a data-parallel job survives a lost
// worker without a server: which members the next view holds, which
// ranks are named lost, which committed state every member rolls back
// (or forward) to, and when a rank may start using the new view. The
// protocol and its reasoning are in docs/recovery.md.
//
// The package is pure, like package ring's plans: no I/O, no goroutines,
// no clock. A Rank is a state machine; Step takes one input (a received
// message, evidence that a peer is lost, a tick) and returns the
// messages to send and the views installed. The decisions (View's
// Majority, the greedy Propose, Coordinator, Reference, ChooseWinner,
// CanAccept) are plain functions, and the tests drive a set of Ranks
// through faults at every message step.
//
// Safety follows Paxos, one instance per epoch: the view of epoch E+1 is
// chosen when a majority of the voters of the installed view of epoch E
// accepted it in one round, and a rank installs a view only once it is
// chosen. Rounds are numbered and each belongs to one coordinator (Round
// carries the coordinator's ID), so one round proposes at most one view.
package recovery
