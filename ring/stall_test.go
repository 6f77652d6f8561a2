package ring

import (
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
)

// stallLog records the stall reports of each rank.
type stallLog struct {
	mu      sync.Mutex
	reports map[int][]Stall
}

func (l *stallLog) onStall(rank int) func(Stall) {
	return func(s Stall) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.reports[rank] = append(l.reports[rank], s)
	}
}

// TestStallReport checks that a rank waiting for a late one reports the
// collective, repeatedly and naming the peer it waits on, and that the
// late rank, whose collective completes at once, reports nothing.
func TestStallReport(t *testing.T) {
	const threshold, late = 40 * time.Millisecond, 300 * time.Millisecond
	log := &stallLog{reports: map[int][]Stall{}}
	cl := newCluster(t, 2, func(c *Config) {
		c.StallThreshold, c.OnStall, c.SmallBytes = threshold, log.onStall(c.Rank), -1
	})
	var waited time.Duration // rank 0's wall time in the collective
	mustAll(t, each(cl.comms, func(r int, c *Comm) error {
		if r == 1 {
			time.Sleep(late)
		}
		start := time.Now()
		defer func() {
			if r == 0 {
				waited = time.Since(start)
			}
		}()
		return c.AllReduce(t.Context(), wire.DTypeFloat32, wire.OpSum, make([]byte, 4096))
	}))
	log.mu.Lock()
	defer log.mu.Unlock()
	if got := log.reports[1]; len(got) != 0 {
		t.Errorf("the late rank reported %+v", got)
	}
	got := log.reports[0]
	// About 300 ms at a 40 ms threshold: one report per threshold
	// waited, fewer if the watchdog's checks ran late.
	if most := int(waited / threshold); len(got) < 3 || len(got) > most {
		t.Fatalf("rank 0 made %d reports in %v, want 3 to %d: %+v", len(got), waited, most, got)
	}
	for i, s := range got {
		if s.Epoch != cl.comms[0].cfg.Epoch || s.Seq != 1 || s.Algo != AlgoRing || s.Bytes != 4096 || s.Peer != 1 {
			t.Errorf("report %d: %+v, want the comm's epoch, seq 1, ring, 4096 bytes, waiting for rank 1", i, s)
		}
		if s.Waited > waited || (i > 0 && (s.Report <= got[i-1].Report || s.Waited <= got[i-1].Waited)) {
			t.Errorf("report %d: number %d after %v, in a collective of %v", i, s.Report, s.Waited, waited)
		}
	}
	if c := cl.comms[0]; c.Started() != 1 {
		t.Errorf("Started = %d after one collective", c.Started())
	}
	if _, err := NewComm(cl.trs[0], Config{Members: cl.ids, StallThreshold: -time.Second}); err == nil {
		t.Error("a negative stall threshold was accepted")
	}
}
