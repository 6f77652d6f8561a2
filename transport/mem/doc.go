// Package mem is an in-process Transport for fast tests and fault injection.
// Package gyre also gives it to a worker alone, a job of one, which then
// binds no port and needs no secret.
//
// A Network stands for the wires between in-process workers: each worker
// joins it under its PeerID and gets a Transport, and the ring, the boundary
// protocol and the gyre package can then run up to dozens of ranks in one
// test binary without sockets. Send copies the payload into a buffered queue
// (like a socket buffer, so a ring that sends before it receives does not
// deadlock) and Recv copies it out; in steady state neither allocates.
//
// The Network injects faults: per-link loss, delay and jitter, partitions
// that silently lose messages across groups, and Kill, which crashes a
// worker so that every peer's calls with it fail at once with a
// *transport.PeerError. Random choices come from sources derived from the
// Network's seed, one per (sender, receiver, channel) stream, so a failing
// test replays with the same seed even when many ranks send concurrently.
//
// The conformance suite in transport/transporttest runs against this package
// as it does against the real transports.
package mem
