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
// Comm is the executor. It runs a Plan over a transport.Transport: the
// receive walker takes Plan.Recvs in order on the caller's goroutine, a send
// walker that the Comm keeps takes Plan.Sends in order, and each waits for
// the other where the After fields say, comparing the other walker's count
// of completed operations. A reducing receive lands in a reused scratch
// buffer and is taken off the transport before its wait, an overwriting one
// goes straight into the caller's buffer, and Avg divides once, at the Final
// receive, before the span is sent on. Plans are cached per shape and
// contexts, scratch and goroutines are reused, so a large allreduce in steady
// state allocates nothing.
//
// Every message header carries the collective's identity (epoch, sequence
// number, algorithm, dtype, op, length, chunk size, step and chunk), which
// the receiver checks against its own plan: ranks that disagree fail with
// ErrMismatch. A rank that fails for any reason sends an abort marker to
// the other members, which fail with an error of the same class and
// forward it, so a failure reaches the waiting ranks instead of leaving
// them to their timeouts. Late is not dead: a collective waits for live
// members up to Config.CollectiveTimeout, and with Config.Liveness (the
// liveness package's heartbeats) fails within Config.PeerTimeout on a
// member that fell silent. Comm's documentation lists the failures and
// what a caller does after one.
//
// Compression. AllReduceCompressed and ReduceScatterCompressed send
// float32 data as bf16 or fp16, halving the bytes on the wire; reductions
// still accumulate in float32. Every compressed message is encoded into or
// received into a reused scratch. They run the uncompressed plan, and the
// headers carry the wire dtype, so ranks that disagree about compression
// fail with ErrMismatch. A partial result is rounded to the wire format at
// every hop, and a complete one once more on the rank that completes it,
// so that every rank ends bit-identical (see Comm for the precision).
//
// Allreduce has two algorithms: the pipelined ring (bandwidth-optimal, for
// large buffers) and recursive doubling (latency-optimal, for small ones).
// Choose picks between them by size, using the α/β cost model described
// on CostModel (and in docs/architecture.md, "Collectives").
package ring
