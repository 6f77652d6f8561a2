package quic

import (
	"fmt"
	"testing"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// newNode starts a transport named id with a leaf from ca on 127.0.0.1,
// with cfg adjusting the defaults, and closes it at the end of the test.
func newNode(tb testing.TB, ca *secret.CA, id string, adjust func(*Config)) *Transport {
	tb.Helper()
	cfg := Config{
		ID:       transport.PeerID(id),
		Identity: transporttest.Issue(tb, ca, id),
		Listen:   "127.0.0.1:0",
		Logger:   transporttest.Logger(tb),
		// Tests read every refusal.
		logEveryRefusal: true,
	}
	return transporttest.Start(tb, cfg, adjust, New)
}

// newNodes returns a transporttest.NewNodes that makes nodes sharing one
// cluster secret.
func newNodes(adjust func(*Config)) transporttest.NewNodes {
	return func(tb testing.TB, n int) []transporttest.Node {
		tb.Helper()
		ca := transporttest.NewCA(tb)
		nodes := make([]transporttest.Node, n)
		for i := range nodes {
			id := fmt.Sprintf("node-%d", i)
			tr := newNode(tb, ca, id, adjust)
			nodes[i] = transporttest.Node{ID: transport.PeerID(id), T: tr, Addr: tr.Addr()}
		}
		return nodes
	}
}
