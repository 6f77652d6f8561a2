// Package liveness tells a late peer from a dead one. A Monitor sends a
// small heartbeat to every watched peer several times per peer timeout, on
// a channel of its own (transport.ChanLiveness), and records when it last
// heard from each. Heartbeats never queue behind gradients or control
// messages, so a peer that is busy, slow to reach a collective or in a GC
// pause keeps answering, while a peer that was killed, stopped (SIGSTOP)
// or cut off falls silent. The ring's executor reads LastHeard (it
// implements ring.Liveness) to fail a collective on a silent member within
// its PeerTimeout, and otherwise waits for late members up to its much
// longer CollectiveTimeout.
//
// A Monitor works over any transport.Transport; the caller connects the
// peers, as it must for its collectives anyway.
package liveness
