package obs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// Boundary outcomes, the outcome label of gyre_boundary_duration_seconds.
const (
	OutcomeNext       = "next"        // on to the next iteration, same view
	OutcomeViewChange = "view_change" // members admitted or departed
	OutcomeRecovered  = "recovered"   // a lost member: redo from the last commit
	OutcomeError      = "error"       // Boundary returned an error
)

// maxAlgo bounds the ring.Algo values Metrics keeps series for.
const maxAlgo = 16

// Metrics is an Observer that keeps Prometheus metrics, served by
// Handler. Collective does not allocate.
type Metrics struct {
	reg *prometheus.Registry

	collSeconds [maxAlgo]prometheus.Observer
	collBytes   [maxAlgo]prometheus.Counter
	collErrors  [maxAlgo]prometheus.Counter

	boundarySeconds *prometheus.HistogramVec
	iteration       prometheus.Gauge
	epoch           prometheus.Gauge
	members         prometheus.Gauge
	pending         prometheus.Gauge
	rank            prometheus.Gauge
	share           *prometheus.GaugeVec
	computeSeconds  prometheus.Gauge
	samplesPerSec   prometheus.Gauge
	viewChanges     prometheus.Counter
	recoveries      prometheus.Counter
	redone          prometheus.Counter
	stalls          *prometheus.CounterVec

	// lastBig is the last allreduce of at least busBWMinBytes, for
	// Status.BusBW, under its own lock (uncontended, and it allocates
	// nothing) so that its figures always belong together.
	lastBig struct {
		sync.Mutex
		bytes, ranks int
		took         time.Duration
	}
	// ages reads the heartbeat ages (WatchHeartbeats); a member is
	// silent past silentAfter.
	ages        HeartbeatAges
	silentAfter time.Duration

	mu         sync.Mutex // guards the fields below, touched at boundaries
	lastMember int        // ranks with a share series
	lastEnd    time.Time  // when the last boundary returned
	rankLabels []string
	st         status
}

// NewMetrics returns metrics whose collective series carry the transport
// label transport (quic, tcp or mem).
func NewMetrics(transport string) *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	f := factory{reg}
	labels := []string{"op", "algorithm", "transport"}
	seconds := f.histogramVec("gyre_collective_duration_seconds",
		"Wall time of collectives on the data channel, from the call to its return.",
		prometheus.ExponentialBuckets(10e-6, 4, 12), labels)
	bytes := f.counterVec("gyre_collective_bytes_total",
		"Bytes of the callers' buffers passed to collectives that completed, before any compression.", labels)
	errs := f.counterVec("gyre_collective_errors_total", "Collectives that returned an error.", labels)
	m := &Metrics{
		reg: reg,
		boundarySeconds: f.histogramVec("gyre_boundary_duration_seconds",
			"Wall time of iteration boundaries: the vote and any view change, probe or recovery, by outcome.",
			prometheus.ExponentialBuckets(50e-6, 4, 12), []string{"outcome"}),
		iteration:      f.gauge("gyre_iteration", "The iteration this worker runs next."),
		epoch:          f.gauge("gyre_view_epoch", "The epoch of this worker's view."),
		members:        f.gauge("gyre_view_members", "Members of this worker's view."),
		pending:        f.gauge("gyre_pending_joiners", "Joiners gossip lists that no view has admitted yet, at the last boundary."),
		rank:           f.gauge("gyre_rank", "This worker's rank in its view."),
		share:          f.gaugeVec("gyre_share_samples", "Samples of the global batch each rank computes per iteration.", []string{"rank"}),
		computeSeconds: f.gauge("gyre_compute_seconds", "This worker's compute time in its last iteration, up to its first Wait."),
		samplesPerSec: f.gauge("gyre_samples_per_second",
			"Global samples per second over the last iteration: the global batch over the time between boundaries."),
		viewChanges: f.counter("gyre_view_changes_total", "Views changed at iteration boundaries: admissions, departures and recoveries."),
		recoveries:  f.counter("gyre_recoveries_total", "Boundaries that recovered from a lost member."),
		redone:      f.counter("gyre_iterations_redone_total", "Iterations run again after recoveries: those since the last commit."),
		stalls: f.counterVec("gyre_stalls_total",
			"Stall reports: collectives this worker waited in past the stall threshold, once per threshold waited.", []string{"collective"}),
	}
	for _, c := range []string{"gradients", "data", "control"} {
		m.stalls.WithLabelValues(c) // every series exists from the start, at 0
	}
	for a := ring.Algo(1); a < maxAlgo && a.Op() != ""; a++ {
		lv := []string{a.Op(), a.String(), transport}
		m.collSeconds[a] = seconds.WithLabelValues(lv...)
		m.collBytes[a] = bytes.WithLabelValues(lv...)
		m.collErrors[a] = errs.WithLabelValues(lv...)
	}
	return m
}

// Collective records a collective.
func (m *Metrics) Collective(s ring.CollectiveStats) {
	if int(s.Algo) >= maxAlgo || m.collSeconds[s.Algo] == nil {
		return
	}
	m.collSeconds[s.Algo].Observe(s.Duration.Seconds())
	if s.Err != nil {
		m.collErrors[s.Algo].Inc()
		return
	}
	m.collBytes[s.Algo].Add(float64(s.Bytes))
	if s.Algo.Op() == ring.OpAllReduce && s.Bytes >= busBWMinBytes {
		m.lastBig.Lock()
		m.lastBig.bytes, m.lastBig.ranks, m.lastBig.took = s.Bytes, s.Ranks, s.Duration
		m.lastBig.Unlock()
	}
}

// Stall counts a stall report and keeps it for the status page.
func (m *Metrics) Stall(s Stall) {
	m.stalls.WithLabelValues(s.Collective).Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.st.Stalls++
	m.st.LastStall = &StallStatus{At: time.Now(), Collective: s.Collective, Iteration: s.Iter, WaitedSeconds: s.Waited.Seconds(),
		Behind: append([]int(nil), s.Behind...), Pending: append([]string(nil), s.Pending...)}
}

// Boundary records a boundary and the view and shares it leaves.
func (m *Metrics) Boundary(b Boundary) {
	outcome := OutcomeNext
	switch {
	case b.Err != nil:
		outcome = OutcomeError
	case b.Redo:
		outcome = OutcomeRecovered
	case b.ViewChanged:
		outcome = OutcomeViewChange
	}
	m.boundarySeconds.WithLabelValues(outcome).Observe(b.Duration.Seconds())
	if b.Err != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	global := 0
	for _, s := range b.Shares {
		global += s
	}
	sps := 0.0
	if !m.lastEnd.IsZero() && !b.Redo && !b.ViewChanged {
		if d := now.Sub(m.lastEnd); d > 0 {
			sps = float64(global) / d.Seconds()
			m.samplesPerSec.Set(sps)
		}
	}
	m.st.update(b, sps, now)
	m.lastEnd = now
	if b.ViewChanged {
		m.viewChanges.Inc()
	}
	if b.Redo {
		m.recoveries.Inc()
		m.redone.Add(float64(max(0, b.Iter+1-b.Next)))
	}
	m.iteration.Set(float64(b.Next))
	m.epoch.Set(float64(b.Epoch))
	m.members.Set(float64(b.Members))
	m.pending.Set(float64(b.Pending))
	m.rank.Set(float64(b.Rank))
	m.computeSeconds.Set(b.Compute.Seconds())
	for len(m.rankLabels) < len(b.Shares) {
		m.rankLabels = append(m.rankLabels, strconv.Itoa(len(m.rankLabels)))
	}
	for r, s := range b.Shares {
		m.share.WithLabelValues(m.rankLabels[r]).Set(float64(s))
	}
	for r := len(b.Shares); r < m.lastMember; r++ {
		m.share.DeleteLabelValues(m.rankLabels[r])
	}
	m.lastMember = len(b.Shares)
}

// HeartbeatAges calls report with each peer's rank and how long ago its
// last heartbeat arrived; it must not block.
type HeartbeatAges func(report func(rank int, age time.Duration))

// WatchHeartbeats serves gyre_heartbeat_age_seconds{rank}, read from ages
// at every scrape rather than pushed, so that a peer gone silent shows its
// age growing between boundaries too; the status page calls a member
// silent past silentAfter (0: never). Call it once, before serving.
func (m *Metrics) WatchHeartbeats(ages HeartbeatAges, silentAfter time.Duration) {
	m.ages, m.silentAfter = ages, silentAfter
	m.reg.MustRegister(&heartbeatCollector{ages: ages, desc: prometheus.NewDesc("gyre_heartbeat_age_seconds",
		"Time since each peer's last heartbeat reached this worker, by the peer's rank.", []string{"rank"}, nil)})
}

type heartbeatCollector struct {
	desc *prometheus.Desc
	ages HeartbeatAges
}

func (c *heartbeatCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *heartbeatCollector) Collect(ch chan<- prometheus.Metric) {
	c.ages(func(rank int, age time.Duration) {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, age.Seconds(), strconv.Itoa(rank))
	})
}

// WatchRefusals serves gyre_refused_connections_total, read from total at
// every scrape: the transport's count of connections refused for their
// credentials (a wrong cluster key, a stray client). Call it once.
func (m *Metrics) WatchRefusals(total func() uint64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "gyre_refused_connections_total",
		Help: "Connections the data-plane transport refused for their credentials: a wrong cluster key or a stray client."},
		func() float64 { return float64(total()) }))
}

// WatchLinks serves the transport's link counters, read from stats at
// every scrape: gyre_transport_connects_total,
// gyre_transport_reconnects_total and gyre_transport_errors_total{kind},
// kind dial (a Connect that failed) or link (a link lost other than in
// order). Call it once.
func (m *Metrics) WatchLinks(stats func() transport.LinkStats) {
	m.reg.MustRegister(&linkCollector{stats: stats,
		connects: prometheus.NewDesc("gyre_transport_connects_total",
			"Connections the data-plane transport brought up to peers, reconnects included.", nil, nil),
		reconnects: prometheus.NewDesc("gyre_transport_reconnects_total",
			"Connections brought up again to a peer whose links had been up before.", nil, nil),
		errors: prometheus.NewDesc("gyre_transport_errors_total",
			"Data-plane transport errors: dial (a connect that failed) or link (a link reset, timed out or broken).", []string{"kind"}, nil)})
}

type linkCollector struct {
	stats                        func() transport.LinkStats
	connects, reconnects, errors *prometheus.Desc
}

func (c *linkCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.connects
	ch <- c.reconnects
	ch <- c.errors
}

func (c *linkCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	ch <- prometheus.MustNewConstMetric(c.connects, prometheus.CounterValue, float64(s.Connects))
	ch <- prometheus.MustNewConstMetric(c.reconnects, prometheus.CounterValue, float64(s.Reconnects))
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(s.DialErrors), "dial")
	ch <- prometheus.MustNewConstMetric(c.errors, prometheus.CounterValue, float64(s.LinkFailures), "link")
}

// Handler serves the metrics in Prometheus' exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// Server serves a worker's metrics over HTTP.
type Server struct {
	srv  *http.Server
	addr net.Addr
	done chan error
}

// Serve listens on addr (host:port; port 0 picks one) and serves m in the
// background: the metrics at /metrics, the status page at / and the same
// as JSON at /status.json. The listener is bound before it returns,
// so a taken port is an error here.
func Serve(addr string, m *Metrics) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("obs: metrics address: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/status.json", m.statusJSON)
	mux.HandleFunc("/", m.statusPage)
	s := &Server{
		srv:  &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		addr: ln.Addr(),
		done: make(chan error, 1),
	}
	go func() { s.done <- s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the address the server listens on.
func (s *Server) Addr() net.Addr { return s.addr }

// Close stops the server, letting requests in progress finish for up to
// a second.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		err = s.srv.Close()
	}
	if serr := <-s.done; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

// factory registers each metric as it makes it.
type factory struct{ reg *prometheus.Registry }

func (f factory) gauge(name, help string) prometheus.Gauge {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	f.reg.MustRegister(g)
	return g
}

func (f factory) counter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	f.reg.MustRegister(c)
	return c
}

func (f factory) gaugeVec(name, help string, labels []string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(g)
	return g
}

func (f factory) counterVec(name, help string, labels []string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	f.reg.MustRegister(c)
	return c
}

func (f factory) histogramVec(name, help string, buckets []float64, labels []string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	f.reg.MustRegister(h)
	return h
}
