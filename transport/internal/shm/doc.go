// Package shm is the shared-memory path between workers on one machine.
//
// It sits beside a network transport (quic or tcp) and feeds the same
// streams core: a Link to a co-located peer opens streams whose bytes
// travel through a memory ring instead of a socket, and the peer's
// listener hands them to its core as inbound streams. Everything above
// the bytes (channels, hellos, framing, cancellation, drops) is the
// core's, as for the network transports.
//
// Same machine means the same kernel and the same network namespace: a
// worker listens on an abstract Unix socket, which lives in its network
// namespace, named after its ID and its network transport's port, and a
// dialer that finds no such socket falls back to the network. Every
// stream is authenticated over that socket with the cluster's
// certificates (TLS 1.3), as the tcp transport authenticates its
// connections, before any memory is handed over. The memory is a sealed
// memfd passed over the socket (SCM_RIGHTS): it has no name, so no other
// process can open it, and it is freed when the last process holding it
// exits. Root and anyone who may ptrace a worker can still read it, as
// they can read the worker's own memory.
package shm
