package ring

import (
	"sync"
	"time"
)

// Stall reports a collective still under way after Config.StallThreshold:
// this rank has entered it and waits. Who it waits for is known only as
// far as this rank's own walk goes (Peer); a runtime whose heartbeats
// carry each rank's Started can name the ranks that have not arrived.
type Stall struct {
	Epoch uint64
	// Seq is the collective's sequence number: Started's value while it
	// runs.
	Seq   uint64
	Algo  Algo
	Bytes int
	// Waited is how long the collective has run.
	Waited time.Duration
	// Peer is the rank this rank's walk waits on: for a message from
	// it, or for it to read one this rank sends; -1 if none.
	Peer int
	// Report counts this collective's reports: 1 at StallThreshold, 2 at
	// twice it, and so on.
	Report int
}

// underWay is the collective in progress as the stall report sees it. The
// watchdog reads it while the caller's goroutine runs the collective, so
// it has a lock of its own.
type underWay struct {
	mu    sync.Mutex
	seq   uint64
	algo  Algo
	bytes int
	start time.Time
	// reported is how many reports the collective seq has had: set
	// reset it, the watchdog counts.
	reported int
}

func (u *underWay) set(seq uint64, algo Algo, bytes int, start time.Time) {
	u.mu.Lock()
	u.seq, u.algo, u.bytes, u.start, u.reported = seq, algo, bytes, start, 0
	u.mu.Unlock()
}

// reportsStalls says whether the Comm reports stalled collectives.
func (c *Comm) reportsStalls() bool { return c.cfg.StallThreshold > 0 && c.cfg.OnStall != nil }

// stallReportPeriod is how often the watchdog looks for a stalled
// collective: an eighth of the threshold, so a report comes within 1.125
// thresholds of the collective's start.
func stallReportPeriod(threshold time.Duration) time.Duration {
	return max(threshold/8, time.Millisecond)
}

// reportStall reports the collective in progress if it has run for
// another StallThreshold since its last report. OnStall runs on a
// goroutine of its own, so that a report writing to a slow disk or pipe
// never delays the watchdog's other work; a report falling due while the
// previous one still runs waits for the next check.
func (c *Comm) reportStall(now time.Time) {
	if _, active := c.ctx.activeGen(); !active || c.reporting.Load() {
		return
	}
	u := &c.under
	u.mu.Lock()
	waited := now.Sub(u.start)
	due := int(waited / c.cfg.StallThreshold)
	if due <= u.reported {
		u.mu.Unlock()
		return
	}
	u.reported = due
	s := Stall{Epoch: c.cfg.Epoch, Seq: u.seq, Algo: u.algo, Bytes: u.bytes, Waited: waited,
		Peer: int(c.op.waiting.Load()), Report: due}
	u.mu.Unlock()
	c.reporting.Store(true)
	c.wg.Add(1) // Close waits for the report: the watchdog is still counted
	go func() {
		defer c.wg.Done()
		defer c.reporting.Store(false)
		c.cfg.OnStall(s)
	}()
}
