package ring

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/quic"
	"github.com/gyre-ml/gyre/transport/tcp"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// realComms starts n ranks over real transports of kind ("tcp" or "quic")
// on 127.0.0.1, connected to each other, and returns their Comms, whose
// Config adjust may change (if not nil).
func realComms(t *testing.T, kind string, n int, adjust func(*Config)) []*Comm {
	t.Helper()
	ca := transporttest.NewCA(t)
	nodes := make([]transporttest.Node, n)
	ids := make([]transport.PeerID, n)
	for i := range nodes {
		id := transport.PeerID(fmt.Sprintf("rank-%d", i))
		ident := transporttest.Issue(t, ca, string(id))
		var tr interface {
			transport.Transport
			transport.Listener
		}
		switch kind {
		case "tcp":
			tr = transporttest.Start(t, tcp.Config{ID: id, Identity: ident, Listen: "127.0.0.1:0"}, nil, tcp.New)
		case "quic":
			tr = transporttest.Start(t, quic.Config{ID: id, Identity: ident, Listen: "127.0.0.1:0"}, nil, quic.New)
		}
		nodes[i] = transporttest.Node{ID: id, T: tr, Addr: tr.Addr()}
		ids[i] = id
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	transporttest.ConnectAll(t, ctx, nodes)
	comms := make([]*Comm, n)
	for r := range comms {
		cfg := testConfig(t, ids, r)
		if adjust != nil {
			adjust(&cfg)
		}
		c, err := NewComm(nodes[r].T, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		comms[r] = c
	}
	return comms
}

func TestRealTransports(t *testing.T) {
	for _, kind := range []string{"tcp", "quic"} {
		for _, n := range []int{2, 4} {
			t.Run(fmt.Sprintf("%s/n=%d", kind, n), func(t *testing.T) {
				comms := realComms(t, kind, n, nil)
				rng := rand.New(rand.NewPCG(uint64(n), 10))
				testAllReduce[float32](t, comms, rng, wire.OpSum, 1<<20/4)
				testAllReduce[float32](t, comms, rng, wire.OpAvg, 1000)
				failAll(t, comms, 10*time.Second, func(r int, c *Comm) error {
					length := 1 << 20 / 4
					if r == n-1 {
						length += 1
					}
					return AllReduce(t.Context(), c, wire.OpSum, make([]float32, length))
				}, isMismatch)
			})
		}
	}
}
