// Package streams is the shared core of Gyre's stream-based transports.
//
// The tcp and quic transports differ only in how they make authenticated
// byte streams: tcp opens one TLS (or plain) TCP connection per stream,
// quic opens unidirectional streams on a QUIC connection. Everything above
// that is here, once: channels and stripes, the wire.Hello that opens every
// stream, framing with wire.Writer and wire.Reader, Recv waiting for a
// peer's stream to arrive, cancellation, typed errors, Drop and Close.
//
// A transport gives the core a DialFunc, which makes a Link to a peer, and
// calls Accept with every inbound stream and the peer name its certificate
// proved. Outbound streams are opened lazily, one per (peer, channel,
// stripe), on the Link of that stripe. Each side sends on streams it opened
// and receives on streams the peer opened, so the two directions of a pair
// never share a stream. The core drops a peer that sends malformed or
// oversized input, as Drop does; Config.OnDrop tells the transport of every
// drop, so that it can close what the core does not own (quic: the
// connections the peer dialed, which carry its streams).
//
// Stripes: a message of at least wire.StripeMin bytes is cut into as many
// near-equal contiguous parts as the sender has stripes, and part s travels
// on stripe s. The receiver learns the stripe count from the Hello and
// applies the same split, reading the stripes concurrently straight into
// the caller's buffer. Smaller messages go whole on stripe 0.
//
// Steady-state Send and Recv allocate nothing: stripe readers and writers
// are persistent goroutines, a caller's context is registered for
// cancellation once rather than per call, and nothing is ever allocated
// from a length a peer sent.
package streams
