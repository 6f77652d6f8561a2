// Package quic is Gyre's default transport: messages over QUIC (quic-go),
// authenticated by mutual TLS 1.3 with leaves of the cluster CA.
//
// A process has one UDP socket and one quic-go Transport on it, used both
// to listen and to dial, so peers see a single address. Every connection
// negotiates ALPN "gyre/1", and each side checks that the other's
// certificate chains to the cluster CA; a dialer also checks that the
// certificate names the peer it meant to reach. Refusals are logged on both
// sides, with the remote address.
//
// Layout: a sender dials its own connections to each peer, Config.Stripes
// of them, and opens on them one long-lived unidirectional stream per
// (channel, stripe). It never receives on them; the peer's messages arrive
// on connections the peer dialed. So each direction of a pair has its own
// connections, with their own congestion control and quic-go run loop, and
// a peer can never open streams on a connection this side dialed. (Bare
// quic-go moving data both ways at once measured the same, within noise,
// over one shared connection; see BenchmarkBareBidirectional.)
//
// Framing, the stream Hello, stripes, Recv, cancellation and errors are the
// shared core in transport/internal/streams; this package makes and
// accepts the connections and streams.
//
// Why stripes: one quic-go stream on loopback moves about 0.2–0.6 GB/s.
// quic-go caps packets at 1452 bytes, so the per-packet cost (a syscall
// share, header protection, ACK processing), not AES-GCM, is the limit,
// and one connection runs on about one core. Striping a large message over
// several connections spreads those packets over several cores.
//
// Liveness: a connection that receives nothing for Config.IdleTimeout is
// dead, and idle connections send keep-alives, so a peer that vanishes
// fails its streams within that bound; a peer that closes its connection
// fails them at once, and so does one that crashed and restarted at the
// same address with the same Config.ResetKey, by a stateless reset, as soon
// as data reaches it on a stale connection. A peer dropped for malformed
// input, or by Drop, has its connections closed.
package quic
