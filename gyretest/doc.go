// Package gyretest is the one harness for tests with several Gyre workers,
// in the manner of hashicorp/raft's MakeCluster.
//
// In-process mode (Start, MakeCluster) joins N workers in one process over
// the in-memory transport, which can Kill, Freeze, Partition and Heal
// them, or over real QUIC or TCP on loopback. Process mode (StartProcs)
// runs N real gyre processes (or any program that embeds Gyre) with the
// static view `gyre launch` gives its children, and can kill (SIGKILL),
// stop (SIGSTOP) and resume them. EnsureSameState checks that workers hold
// identical state.
//
// gyretest imports gyre, so tests of package gyre that use it live in the
// external test package gyre_test.
package gyretest
