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

// realComms starts n ranks over real transports of kind on 127.0.0.1,
// connected to each other, and returns their Comms, whose Config adjust
// may change (if not nil). kind is "tcp" or "quic"; "shm", quic with
// every link through shared memory; or "mixed", tcp with shared memory
// on the even ranks only, so that links between them are shared memory
// and the others TCP.
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
		case "tcp", "mixed":
			shm := kind == "mixed" && i%2 == 0
			tr = transporttest.Start(t, tcp.Config{ID: id, Identity: ident, Listen: "127.0.0.1:0", SharedMemory: shm}, nil, tcp.New)
		case "quic", "shm":
			tr = transporttest.Start(t, quic.Config{ID: id, Identity: ident, Listen: "127.0.0.1:0", SharedMemory: kind == "shm"}, nil, quic.New)
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

// TestSharedMemoryMatrix runs allreduce and reduce-scatter of every
// dtype and op over shared memory alone and over a job that mixes it
// with TCP, at lengths that split unevenly and chunk sizes that pipeline
// (the 256 KiB a view on shared memory runs) or not.
func TestSharedMemoryMatrix(t *testing.T) {
	for _, kind := range []string{"shm", "mixed"} {
		for _, n := range []int{2, 3} {
			t.Run(fmt.Sprintf("%s/n=%d", kind, n), func(t *testing.T) {
				comms := realComms(t, kind, n, nil)
				if kind == "shm" {
					mustAll(t, each(comms, func(_ int, c *Comm) error { return c.SetChunk(256 << 10) }))
				}
				rng := rand.New(rand.NewPCG(uint64(n), 38))
				for _, length := range []int{1, 1000, 1<<18 + 3} {
					for _, op := range []wire.Op{wire.OpSum, wire.OpMin, wire.OpMax} {
						testAllReduce[float32](t, comms, rng, op, length)
						testAllReduce[int64](t, comms, rng, op, length/2+1)
					}
					testAllReduce[float64](t, comms, rng, wire.OpAvg, length)
					testAllReduce[int32](t, comms, rng, wire.OpSum, length)
					testReduceScatter[float32](t, comms, rng, wire.OpSum, length*n)
				}
				testAllReduce[float32](t, comms, rng, wire.OpSum, 3<<20) // 12 MiB: many chunks, the ring wrapped
			})
		}
	}
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
