package gyre

import (
	"fmt"
	"time"

	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Observer is told what the runtime does, as it happens: every collective
// on the data channel (Worker.Comm and the fusers, with its operation,
// algorithm, bytes, duration and error) and every iteration boundary
// (BoundaryStats). Set one in Config.Observer; Config.MetricsAddr installs
// the Prometheus one beside it. Its methods run on the runtime's
// goroutines and must be quick; Collective must not block or allocate.
//
// An Observer may also have any of these methods, each called when it
// applies:
//
//	Span(kind string, iter int64, start, end time.Time) // the trainer's spans (StartSpan) and the runtime's own
//	Bucket(BucketStats)                                  // every gradient bucket, with its tensors and phases
//	Stall(StallReport)                                   // every stall report (Config.StallThreshold)
type Observer = obs.Observer

// BoundaryStats describes one iteration boundary, for Observer.Boundary.
type BoundaryStats = obs.Boundary

// CollectiveStats describes one collective, for Observer.Collective.
type CollectiveStats = ring.CollectiveStats

// BucketStats describes one gradient bucket: its tensors' names and the
// times of its phases, for an Observer's Bucket method.
type BucketStats = ring.BucketStats

// StallReport is one stall report, for an Observer's Stall method: the
// collective this worker waited in past Config.StallThreshold, the ranks
// that had not reached it and the tensors pending.
type StallReport = obs.Stall

// MetricsAddr returns the address the worker serves its Prometheus
// metrics on (Config.MetricsAddr, with the port chosen if it was 0), or ""
// if it serves none.
func (w *Worker) MetricsAddr() string {
	if w.metrics == nil {
		return ""
	}
	return w.metrics.Addr().String()
}

// startObservers opens the timeline Config.Timeline asks for, starts the
// metrics endpoint of Config.MetricsAddr, and sets the observer the
// worker reports to: those and Config.Observer.
func (w *Worker) startObservers() error {
	w.observer = w.cfg.Observer
	if w.cfg.Timeline != "" {
		tr, err := obs.NewTrace(w.cfg.Timeline, w.timelineSkew)
		if err != nil {
			return fmt.Errorf("%w: Timeline (--timeline): %w", ErrConfig, err)
		}
		w.trace = tr
		w.observer = obs.Multi(w.observer, tr)
	}
	return w.serveMetrics()
}

// serveMetrics starts the metrics endpoint Config.MetricsAddr asks for.
func (w *Worker) serveMetrics() error {
	if w.cfg.MetricsAddr == "" {
		return nil
	}
	tname := w.cfg.Transport
	if w.cfg.lone() {
		tname = "mem"
	}
	m := obs.NewMetrics(tname)
	m.WatchHeartbeats(w.heartbeatAges, w.cfg.PeerTimeout)
	if rc, ok := w.t.(transport.RefusalCounter); ok {
		m.WatchRefusals(rc.RefusalsTotal)
	}
	if lc, ok := w.t.(transport.LinkCounter); ok {
		m.WatchLinks(lc.LinkStats)
	}
	srv, err := obs.Serve(w.cfg.MetricsAddr, m)
	if err != nil {
		return fmt.Errorf("%w: MetricsAddr (--metrics-addr) %q: %w", ErrConfig, w.cfg.MetricsAddr, err)
	}
	w.metrics = srv
	w.observer = obs.Multi(w.observer, m)
	w.log.Info().Str("metrics_addr", srv.Addr().String()).Msg("serving metrics at http://" + srv.Addr().String() + "/metrics")
	return nil
}

// observeBoundary reports a boundary that ran from start and returned ch
// and err.
func (w *Worker) observeBoundary(iter int64, compute time.Duration, start time.Time, ch Change, err error) {
	if w.observer == nil {
		return
	}
	rank := -1
	if err == nil && !ch.Left {
		rank = w.Rank()
	}
	b := BoundaryStats{Iter: iter, Next: ch.Iter, Duration: time.Since(start), Compute: compute, Err: err,
		Epoch: ch.View.Epoch, Members: len(ch.View.Members), MemberNames: ch.View.Members, Rank: rank, Shares: ch.Shares,
		ViewChanged: ch.ViewChanged, SharesChanged: ch.SharesChanged, Redo: ch.Redo, Pending: w.joiners}
	if err == nil && !ch.ViewChanged {
		b.Computes = w.computes
	}
	w.observer.Boundary(b)
}

// heartbeatAges reports how long ago each other member of the current view
// was last heard from.
func (w *Worker) heartbeatAges(report func(rank int, age time.Duration)) {
	w.mu.Lock()
	vs := w.cur
	w.mu.Unlock()
	if vs == nil || w.live == nil {
		return
	}
	now := time.Now()
	for r, id := range vs.ids {
		if heard := w.live.LastHeard(id); r != vs.rank && !heard.IsZero() {
			report(r, now.Sub(heard))
		}
	}
}

// observeSpan reports the runtime's own phase name, from start to now,
// to an observer that takes spans (the timeline): link probes, state
// transfers.
func (w *Worker) observeSpan(name string, start time.Time) {
	if so, ok := w.observer.(obs.SpanObserver); ok {
		so.Span(name, w.iter, start, time.Now())
	}
}
