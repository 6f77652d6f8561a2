package mem

import (
	"context"

	"github.com/gyre-ml/gyre/transport"
)

// Freeze stops the node id as SIGSTOP stops a process: its connections stay
// up and nobody sees an error, but it falls silent. Its pending and later
// Sends and Recvs block until Thaw (or their context ends, or the node is
// closed or killed); messages sent to it queue, and messages it sent before
// the freeze are still delivered. A node that is not live is ignored.
func (n *Network) Freeze(id transport.PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.nodes[id]; t != nil {
		t.frozenMu.Lock()
		if t.frozen == nil {
			t.frozen = make(chan struct{})
		}
		t.frozenMu.Unlock()
	}
}

// Thaw resumes a node stopped by Freeze; its blocked calls carry on.
func (n *Network) Thaw(id transport.PeerID) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if t := n.nodes[id]; t != nil {
		t.frozenMu.Lock()
		if t.frozen != nil {
			close(t.frozen)
			t.frozen = nil
		}
		t.frozenMu.Unlock()
	}
}

// waitThawed returns at once unless t is frozen, and otherwise when it is
// thawed, ctx ends or t closes.
func (t *Transport) waitThawed(ctx context.Context) error {
	for {
		t.frozenMu.Lock()
		thaw := t.frozen
		t.frozenMu.Unlock()
		if thaw == nil {
			return nil
		}
		select {
		case <-thaw:
		case <-ctx.Done():
			return ctx.Err()
		case <-t.done:
			return transport.ErrClosed
		}
	}
}
