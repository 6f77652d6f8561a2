// Package transport defines how Gyre workers move messages to each other.
//
// A Transport sends and receives whole messages (a wire.Header plus payload)
// to and from peers, on independent ordered channels. Implementations live in
// sub-packages: quic (the default), tcp (TLS 1.3 over TCP, or plain TCP when
// insecure) and mem (in-process, with fault injection, for tests). The ring
// executor and the boundary protocol are written against this interface
// alone.
//
// The conformance suite in transport/transporttest checks that an
// implementation keeps the contract below.
package transport
