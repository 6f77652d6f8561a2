package transport

import (
	"errors"
	"fmt"
)

var (
	// ErrClosed is returned by calls on, or pending during, a closed transport.
	ErrClosed = errors.New("transport: closed")
	// ErrUnauthenticated means the peer failed the mutual certificate check.
	ErrUnauthenticated = errors.New("transport: peer not authenticated")
	// ErrPeerGone is matched by every PeerError.
	ErrPeerGone = errors.New("transport: peer gone")
	// ErrNotConnected means Send was called for a peer never passed to Connect.
	ErrNotConnected = errors.New("transport: peer not connected")
	// ErrBadChannel means a channel at or above NumChannels was used.
	ErrBadChannel = errors.New("transport: unknown channel")
	// ErrClosedByPeer is matched by a PeerError whose cause the peer sent:
	// it closed or reset the stream or the connection, or dropped this
	// process. The peer was alive then; it may have left the collective
	// (to recover, say) rather than died. Transports that cannot tell
	// (TCP: a killed process's kernel closes its sockets as a live one
	// does) never mark it.
	ErrClosedByPeer = errors.New("transport: closed by the peer")
)

// ClosedByPeer marks err, a link failure the peer sent, as matching
// ErrClosedByPeer. Its message is err's.
func ClosedByPeer(err error) error { return closedByPeer{err} }

type closedByPeer struct{ error }

func (e closedByPeer) Is(target error) bool { return target == ErrClosedByPeer }
func (e closedByPeer) Unwrap() error        { return e.error }

// PeerError reports that a peer can no longer be used: its connection
// failed or closed, it sent input that is not a valid frame, or it was
// dropped. It matches ErrPeerGone and unwraps to the cause, so callers can
// test for both errors.Is(err, ErrPeerGone) and, say, wire.ErrTooLarge.
type PeerError struct {
	Peer PeerID
	Op   string // "connect", "send" or "recv"
	Err  error
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("transport: %s peer %s: %v", e.Op, e.Peer, e.Err)
}

// Unwrap returns the cause.
func (e *PeerError) Unwrap() error { return e.Err }

// Is makes every PeerError match ErrPeerGone.
func (e *PeerError) Is(target error) bool { return target == ErrPeerGone }

// PeerOf returns the peer named by the first PeerError in err's chain.
func PeerOf(err error) (PeerID, bool) {
	var pe *PeerError
	if errors.As(err, &pe) {
		return pe.Peer, true
	}
	return "", false
}
