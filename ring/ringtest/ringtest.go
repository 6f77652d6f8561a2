// Package ringtest builds ring.Comms for tests: n ranks over an in-process
// network, connected to each other and closed at the test's cleanup.
package ringtest

import (
	"fmt"
	"testing"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// MemComms returns n Comms at epoch 1 over a new in-memory network, one
// per rank, in rank order. adjust, if not nil, changes each rank's
// configuration before its Comm is made.
func MemComms(tb testing.TB, n int, adjust func(rank int, c *ring.Config)) []*ring.Comm {
	tb.Helper()
	net := mem.NewNetwork(1)
	ids := make([]transport.PeerID, n)
	trs := make([]transport.Transport, n)
	for r := range n {
		ids[r] = transport.PeerID(fmt.Sprintf("r%d", r))
		tr, err := net.Join(ids[r])
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { tr.Close() })
		trs[r] = tr
	}
	comms := make([]*ring.Comm, n)
	for r, tr := range trs {
		for q, id := range ids {
			if q != r {
				if err := tr.Connect(tb.Context(), id, string(id)); err != nil {
					tb.Fatal(err)
				}
			}
		}
		cfg := ring.Config{Epoch: 1, Members: ids, Rank: r, Logger: zerolog.Nop()}
		if adjust != nil {
			adjust(r, &cfg)
		}
		c, err := ring.NewComm(tr, cfg)
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { c.Close() })
		comms[r] = c
	}
	return comms
}
