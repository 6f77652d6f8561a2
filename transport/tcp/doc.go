// Package tcp is Gyre's TLS 1.3 over TCP transport, the fast path for
// datacenter links, with a plain-TCP mode for trusted networks (Insecure).
//
// Every outbound stream of the shared core (transport/internal/streams) is
// its own TCP connection: channels and stripes never share a socket, so a
// slow control message cannot queue behind a bulk transfer, and a Recv
// reads straight from its socket into the caller's buffer. Connections are
// mutually authenticated with leaves of the cluster CA (internal/secret);
// the server names the peer from its certificate and the Hello must agree.
// After the handshake the server sends one acknowledgement byte, so the
// dialer learns at Connect time, not at its first Send, when the server
// refused its certificate (in TLS 1.3 the client finishes its handshake
// before the server has checked it).
//
// Connections on the listening port are handshaken each in its own
// goroutine under HandshakeTimeout, so a slow or hostile client cannot
// hold up others, and each costs a small fixed amount of memory until it
// has proved it holds the cluster secret.
package tcp
