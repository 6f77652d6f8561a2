// Package ring holds Gyre's collectives: allreduce, reduce-scatter,
// allgather, broadcast and barrier.
//
// A collective is first a pure plan. A constructor such as RingAllReduce
// maps (world size, rank, length, chunk size) to a Plan: the ordered list of
// this rank's sends and receives, each with the one earlier operation it
// waits for. Planning does no I/O, reads no clock and starts no goroutine,
// the way etcd's raft keeps its protocol apart from the network. So every
// schedule is checked exhaustively, against naive reference implementations,
// by a simulator that interleaves all ranks' plans (see the package tests).
//
// The executor, which arrives in a later increment, runs a Plan over a
// transport.Transport: one goroutine walks Plan.Sends in order, another walks
// Plan.Recvs in order, and the After fields say where each must wait for the
// other. Plan's documentation states that contract in full.
//
// Allreduce has two algorithms: the pipelined ring (bandwidth-optimal, for
// large buffers) and recursive doubling (latency-optimal, for small ones).
// Choose picks between them by size, using the α/β cost model of DESIGN.md
// as described on CostModel.
package ring
