// Package wire encodes and decodes Gyre's data-plane frames.
//
// A message (one transport Send) is a Header plus a payload of Header.Len
// bytes. On a byte stream it travels as one or more frames; each frame is a
// fixed 64-byte FrameHeader followed by at most Limits.MaxFrame payload bytes.
// Every frame repeats the message header, so a receiver can validate each one
// on its own, and carries the byte offset of its payload within the message,
// so frames of one message may be spread over several streams (stripes).
//
// The decoder never allocates on behalf of the peer: it checks every length
// against Limits before any payload byte is read, and payload is copied only
// into buffers the caller owns. Malformed input yields an error that wraps
// ErrMalformed; lengths beyond the limits wrap ErrTooLarge.
package wire
