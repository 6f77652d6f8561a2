package tcp

import (
	"fmt"
	"testing"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// newNode starts a transport named id on 127.0.0.1 with a leaf from ca
// (insecure if ca is nil), adjusted by adjust, and closes it at the end of
// the test.
func newNode(tb testing.TB, ca *secret.CA, id string, adjust func(*Config)) *Transport {
	tb.Helper()
	cfg := Config{ID: transport.PeerID(id), Listen: "127.0.0.1:0", Logger: transporttest.Logger(tb), logEveryRefusal: true}
	if ca != nil {
		cfg.Identity = transporttest.Issue(tb, ca, id)
	} else {
		cfg.Insecure = true
	}
	return transporttest.Start(tb, cfg, adjust, New)
}

// newNodes returns a transporttest.NewNodes making TLS nodes that share one
// cluster secret, or insecure nodes.
func newNodes(insecure bool, adjust func(*Config)) transporttest.NewNodes {
	return func(tb testing.TB, n int) []transporttest.Node {
		tb.Helper()
		var ca *secret.CA
		if !insecure {
			ca = transporttest.NewCA(tb)
		}
		nodes := make([]transporttest.Node, n)
		for i := range nodes {
			id := fmt.Sprintf("node-%d", i)
			tr := newNode(tb, ca, id, adjust)
			nodes[i] = transporttest.Node{ID: transport.PeerID(id), T: tr, Addr: tr.Addr()}
		}
		return nodes
	}
}
