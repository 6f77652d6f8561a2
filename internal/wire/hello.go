package wire

import "io"

// MaxPeerID is the longest peer ID a Hello may carry.
const MaxPeerID = 255

// helloMagic starts every stream, before any frame.
var helloMagic = [3]byte{'G', 'Y', 'H'}

// helloFixed is the size of a Hello without its peer ID.
const helloFixed = 8

// Hello opens every data-plane stream. It names the sender and says which
// channel and which stripe the stream carries. On authenticated transports
// the receiver also checks From against the peer's certificate.
type Hello struct {
	From    string
	Channel uint8
	Stripe  uint8 // index of this stream among the channel's stripes
	Stripes uint8 // stripes the sender uses for the channel
}

// AppendHello appends the encoding of h to b.
func AppendHello(b []byte, h Hello) []byte {
	b = append(b, helloMagic[:]...)
	b = append(b, Version, h.Channel, h.Stripe, h.Stripes, uint8(len(h.From)))
	return append(b, h.From...)
}

// ReadHello reads and validates a Hello. It reads at most
// helloFixed+MaxPeerID bytes whatever the input.
func ReadHello(r io.Reader) (Hello, error) {
	var b [helloFixed + MaxPeerID]byte
	if _, err := io.ReadFull(r, b[:helloFixed]); err != nil {
		return Hello{}, err
	}
	if b[0] != helloMagic[0] || b[1] != helloMagic[1] || b[2] != helloMagic[2] {
		return Hello{}, malformed("bad hello magic %q", b[:3])
	}
	if b[3] != Version {
		return Hello{}, &VersionError{Got: b[3]}
	}
	h := Hello{Channel: b[4], Stripe: b[5], Stripes: b[6]}
	n := int(b[7])
	if h.Stripes == 0 || h.Stripe >= h.Stripes {
		return Hello{}, malformed("stripe %d of %d", h.Stripe, h.Stripes)
	}
	if n == 0 {
		return Hello{}, malformed("empty peer id")
	}
	if _, err := io.ReadFull(r, b[helloFixed:helloFixed+n]); err != nil {
		return Hello{}, err
	}
	h.From = string(b[helloFixed : helloFixed+n])
	return h, nil
}
