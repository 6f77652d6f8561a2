package transport

import (
	"context"
	"strconv"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
)

// PeerID names a worker. On authenticated transports it is the common name
// of the peer's certificate, so a peer cannot claim another's ID.
type PeerID string

// Channel is an independent ordered message stream between two peers. A
// receive on one channel never consumes a message sent on another.
type Channel uint8

// Channels in use. Transports support every Channel below NumChannels.
const (
	ChanData     Channel = iota // collective payloads
	ChanControl                 // boundary records and other control traffic
	ChanProbe                   // link probes
	ChanLiveness                // heartbeats, apart from everything else (package liveness)
	ChanJoin                    // the admission handshake between a pending joiner and the members
	ChanRecovery                // recovery's rounds, when a member is lost
	NumChannels
)

func (c Channel) String() string {
	switch c {
	case ChanData:
		return "data"
	case ChanControl:
		return "control"
	case ChanProbe:
		return "probe"
	case ChanLiveness:
		return "liveness"
	case ChanJoin:
		return "join"
	case ChanRecovery:
		return "recovery"
	}
	return "chan(" + strconv.Itoa(int(c)) + ")"
}

// Transport moves messages between peers.
//
// Messages on one (peer, channel) pair arrive whole and in the order they
// were sent. Every method is safe for concurrent use, with one exception:
// at most one Recv at a time per (peer, channel). Every blocking method
// returns when ctx is done (with ctx.Err()) or when the transport is closed
// (with ErrClosed).
type Transport interface {
	// Connect makes peer reachable at addr for Send. It is idempotent: a
	// second call for a connected peer returns nil at once. It blocks until
	// the connection is authenticated, and fails with an error wrapping
	// ErrUnauthenticated if the peer does not hold the cluster secret.
	Connect(ctx context.Context, peer PeerID, addr string) error

	// Send delivers one message of len(payload) bytes to peer on ch. It sets
	// hdr.Len. The peer must have been passed to Connect on this side
	// (ErrNotConnected otherwise); a header that fails wire.Header.Validate
	// is refused with an error wrapping wire.ErrMalformed and nothing is
	// sent. It blocks until the payload has been handed to the network (or
	// copied), so the caller may reuse payload when Send returns. A Send
	// that fails with a PeerError has abandoned this side's link to the
	// peer: Connect must be called again (it dials afresh) before the next
	// Send. What the peer dialled is left alone.
	Send(ctx context.Context, peer PeerID, ch Channel, hdr wire.Header, payload []byte) error

	// Recv reads the next message from peer on ch into buf and returns its
	// header and length. It does not allocate per message. A message longer
	// than buf is discarded and Recv returns its header with an error
	// wrapping wire.ErrShortBuffer; the channel stays usable. Recv works
	// whether or not this side called Connect: it waits for the peer to open
	// the channel.
	//
	// If ctx ends before any byte of the next message has arrived, Recv
	// returns ctx.Err() and the channel stays usable. If it ends part-way
	// through a message, the channel is out of step: Recv returns ctx.Err()
	// and later Recvs from that peer on ch fail with a PeerError. A
	// collective cancelled mid-transfer is abandoned, never resumed.
	Recv(ctx context.Context, peer PeerID, ch Channel, buf []byte) (wire.Header, int, error)

	// Close releases every connection and unblocks every pending call with
	// ErrClosed. It is idempotent and returns nil on a healthy transport.
	// Messages already handed to the network may or may not be delivered.
	Close() error
}

// Listener is implemented by transports that accept connections.
type Listener interface {
	// Addr returns the address peers should pass to Connect.
	Addr() string
}

// Dropper is implemented by transports that can abandon a peer, failing
// its pending calls with a PeerError. The ring uses it to abandon a dead
// peer. Drop does not block on the network and is safe for concurrent use.
type Dropper interface {
	Drop(peer PeerID, reason error)
}

// Forgetter is implemented by transports that can forget a peer for good:
// Forget drops it, as Dropper does, and releases every record of it, so
// that a membership whose peers come and go leaves nothing behind. A later
// Connect or Recv treats the peer as never seen. It does not block on the
// network and is safe for concurrent use.
type Forgetter interface {
	Forget(peer PeerID)
}

// SendBufferer is implemented by transports whose Send usually returns
// before the peer receives, as long as the messages sent to it on one
// channel and not yet received hold at most SendBuffer bytes, payloads
// and wire.FrameHeaderSize per message together. The ring then runs a
// small collective's sends and receives on one goroutine: each hand-off
// between goroutines costs a scheduler wake-up, which is most of a small
// message's time on a busy machine. It is a hint, not a promise: a send
// that blocks anyway costs the ring up to 200 ms once, after which it
// moves the receives to a second goroutine and no longer runs a
// collective that sends as much inline.
type SendBufferer interface {
	SendBuffer() int
}

// Reopener is implemented by transports whose channels are streams that
// a cancelled receive can leave out of step (transport.Transport.Recv).
// Reopen closes this side's streams of ch to peer, if any are open: the
// next Send opens new ones, which the peer reads once it has read what
// the old ones still hold, or at once if it gave up on them. A worker
// reopens its links at the start of a view after a failed exchange, so
// that no receive of the new view waits on a stream the old one broke.
// Streams the peer opened before its Reopen but that arrive after this
// side's look new: if the peer reset them, they fail one receive.
// Reopen does not block on the network and is safe for concurrent use.
type Reopener interface {
	Reopen(peer PeerID, ch Channel)
}

// Striper is implemented by transports that can split large messages
// (wire.StripeMin bytes and more) over several connections per peer, the
// stripes, so that one link uses several cores and congestion windows.
// How many pays depends on the links, so a job chooses per channel at run
// time, after measuring them, rather than once in its configuration.
//
// A channel's streams are opened in generations, and the receiver learns
// a generation's stripe count from its first stream; a count that changed
// under a generation would split messages differently on the two sides.
// So a new count takes effect only at this side's next generation of ch
// to each peer: the first Send on ch to a peer, or the first after a
// Reopen or after a Send cut short. To switch a channel in use, both
// sides Reopen it (Reopener) at a point where it is idle, after
// SetStripes; or SetStripes before the channel's first use. A peer
// reached through shared memory always uses one stripe: a memory ring
// gains nothing from more. Both methods are safe for concurrent use and
// do not block.
type Striper interface {
	// SetStripes makes the generations of ch's streams opened from now
	// on, to every peer, use k stripes: 1 to the transport's maximum,
	// else it returns an error and changes nothing. Connections missing
	// for the new count are dialed when a Send first needs them.
	SetStripes(ch Channel, k int) error
	// Stripes returns ch's current setting (0 for an unknown channel).
	Stripes(ch Channel) int
}

// SharedMemoryReporter is implemented by transports that can reach peers
// on this machine through shared memory. SharedMemory reports whether
// this side's links to peer do: false for a peer not connected, or
// reached over the network. It does not block and is safe for
// concurrent use.
type SharedMemoryReporter interface {
	SharedMemory(peer PeerID) bool
}

// Refusal is an inbound connection that a transport refused during
// authentication: the peer does not hold this cluster's secret.
type Refusal struct {
	// Remote is the refused connection's remote address. Over QUIC it is
	// the peer's listening address; over TCP the port is ephemeral.
	Remote string
	// Claimed is the common name in the certificate the peer presented,
	// which is its peer ID if it is a Gyre worker. It is unverified (the
	// certificate did not check out), so it serves only to name the peer
	// in errors and logs. "" if it presented none.
	Claimed PeerID
	At      time.Time
	// Err says why; it wraps ErrUnauthenticated.
	Err error
}

// RefusalReporter is implemented by transports that authenticate peers.
// Refusals returns the most recent refusals, oldest first, at most a fixed
// number (64). It does not block and is safe for concurrent use. A worker
// uses it to name a peer whose secret differs instead of waiting for it.
type RefusalReporter interface {
	Refusals() []Refusal
}

// RefusalCounter is implemented by transports that count every refusal,
// beyond the bounded list RefusalReporter keeps, for metrics. It does not
// block and is safe for concurrent use.
type RefusalCounter interface {
	RefusalsTotal() uint64
}

// LinkCounter is implemented by transports that count their links'
// events, for metrics. It does not block and is safe for concurrent use.
type LinkCounter interface {
	LinkStats() LinkStats
}

// LinkStats counts a transport's link events since it was created.
type LinkStats struct {
	// Connects counts Connects that brought a peer's links up, and
	// Reconnects those of them to a peer whose links had been up before
	// (after a failure or a Drop).
	Connects, Reconnects uint64
	// DialErrors counts Connects that failed to dial, and Sends that
	// failed to dial a link a stripe needed later (Striper).
	DialErrors uint64
	// LinkFailures counts links lost other than in order: reset, timed
	// out or broken, as when a peer crashes or is cut off.
	LinkFailures uint64
}
