package obs

import (
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/transport"
)

// Options say what a worker reports to.
type Options struct {
	// Observer is the trainer's own observer, nil for none.
	Observer Observer
	// Timeline, if set, is the file of the worker's Chrome trace, its
	// clock shifted by Skew (a test's).
	Timeline string
	Skew     time.Duration
	// MetricsAddr, if set, is where the Prometheus metrics and the status
	// page are served; Transport names the transport in them, and T is it,
	// for its refusal and link counters.
	MetricsAddr string
	Transport   string
	T           transport.Transport
	// Heartbeats reports the other members' heartbeat ages, silent past
	// PeerTimeout.
	Heartbeats  HeartbeatAges
	PeerTimeout time.Duration
	Log         zerolog.Logger
}

// Reporting is what a worker reports to: Observer is every observer in
// one, the trainer's, the timeline and the metrics.
type Reporting struct {
	Observer Observer
	Metrics  *Server
	Trace    *Trace
	timeline string
	log      zerolog.Logger
}

// Open opens the timeline and starts the metrics endpoint that o asks
// for. The errors name the option at fault; the caller wraps them.
func Open(o Options) (*Reporting, error) {
	r := &Reporting{Observer: o.Observer, timeline: o.Timeline, log: o.Log}
	if o.Timeline != "" {
		tr, err := NewTrace(o.Timeline, o.Skew)
		if err != nil {
			return nil, fmt.Errorf("Timeline (--timeline): %w", err)
		}
		r.Trace = tr
		r.Observer = Multi(r.Observer, tr)
	}
	if o.MetricsAddr == "" {
		return r, nil
	}
	m := NewMetrics(o.Transport)
	m.WatchHeartbeats(o.Heartbeats, o.PeerTimeout)
	if rc, ok := o.T.(transport.RefusalCounter); ok {
		m.WatchRefusals(rc.RefusalsTotal)
	}
	if lc, ok := o.T.(transport.LinkCounter); ok {
		m.WatchLinks(lc.LinkStats)
	}
	srv, err := Serve(o.MetricsAddr, m)
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("MetricsAddr (--metrics-addr) %q: %w", o.MetricsAddr, err)
	}
	r.Metrics = srv
	r.Observer = Multi(r.Observer, m)
	o.Log.Info().Str("metrics_addr", srv.Addr().String()).Msg("serving metrics at http://" + srv.Addr().String() + "/metrics")
	return r, nil
}

// MetricsAddr is the address the metrics are served on, "" for none.
func (r *Reporting) MetricsAddr() string {
	if r == nil || r.Metrics == nil {
		return ""
	}
	return r.Metrics.Addr().String()
}

// Span reports the runtime's own phase name, from start to now, to an
// observer that takes spans (the timeline).
func (r *Reporting) Span(name string, iter int64, start time.Time) {
	if so, ok := r.Observer.(SpanObserver); ok {
		so.Span(name, iter, start, time.Now())
	}
}

// Close stops the metrics server and completes the timeline, logging
// what fails.
func (r *Reporting) Close() {
	if r == nil {
		return
	}
	if r.Metrics != nil {
		if err := r.Metrics.Close(); err != nil {
			r.log.Warn().Err(err).Str("metrics_addr", r.MetricsAddr()).Msg("the metrics server did not stop cleanly")
		}
	}
	if r.Trace != nil {
		if err := r.Trace.Close(); err != nil {
			r.log.Warn().Err(err).Str("timeline", r.timeline).Msg("the timeline could not be written")
		}
	}
}
