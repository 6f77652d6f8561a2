package gyre_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/ring"
	"github.com/gyre-ml/gyre/transport"
)

// TestMetricsEndpoint runs 2 workers over real QUIC, each serving metrics
// on a port of its own, and fetches /metrics over HTTP after fixed-size
// allreduces and a few iterations: every metric docs/operations.md lists
// is there, the allreduces' bytes are their exact count, the histogram
// counted every call and its sum fits in the wall time around them, and
// the shares sum to the global batch.
func TestMetricsEndpoint(t *testing.T) {
	const (
		n, batch, iters = 2, 96, 4
		calls, size     = 7, 96 << 10 // bytes per allreduce
	)
	c := gyretest.MakeCluster(t, gyretest.Options{N: n, Transport: gyretest.QUIC,
		Config: func(_ int, c *gyre.Config) {
			c.MetricsAddr, c.GlobalBatch, c.Algo = "127.0.0.1:0", batch, gyre.AlgoRing
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	walls := make([]time.Duration, n)
	errs := c.Run(func(r int, w *gyre.Worker) error {
		if w.MetricsAddr() == "" {
			return errors.New("MetricsAddr is empty with Config.MetricsAddr set")
		}
		comm, err := w.Comm()
		if err != nil {
			return err
		}
		data := make([]float32, size/4)
		start := time.Now()
		for range calls {
			if err := ring.AllReduce(ctx, comm, wire.OpSum, data); err != nil {
				return err
			}
		}
		walls[r] = time.Since(start)
		return iterate(ctx, w, iters, nil)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	// A client with another cluster key is refused, and counted.
	quiet := zerolog.Nop()
	stray, err := gyre.NewTransport(gyre.Config{Transport: gyre.TransportQUIC, Key: gyretest.Key(t), DataAddr: "127.0.0.1:0",
		Name: "stray", Logger: &quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()
	if err := stray.Connect(ctx, c.IDs[0], string(c.IDs[0])); !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("a connection with another key: %v, want ErrUnauthenticated", err)
	}
	// The worker counts the refusal once its side of the handshake ends,
	// which may be after the stray's Connect returned.
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if value(t, scrape(t, c.Workers[0].MetricsAddr()), "gyre_refused_connections_total", nil) > 0 {
			break
		}
	}
	documented := documentedMetrics(t)
	for r, w := range c.Workers {
		fams := scrape(t, w.MetricsAddr())
		for _, name := range documented {
			if fams[name] == nil {
				t.Errorf("rank %d: documented metric %s is not served", r, name)
			}
		}
		labels := map[string]string{"op": "allreduce", "algorithm": "ring", "transport": "quic"}
		if got := value(t, fams, "gyre_collective_bytes_total", labels); got != calls*size {
			t.Errorf("rank %d: gyre_collective_bytes_total %v, want %d allreduces of %d bytes = %d", r, got, calls, size, calls*size)
		}
		h := series(t, fams, "gyre_collective_duration_seconds", labels).GetHistogram()
		if h.GetSampleCount() != calls {
			t.Errorf("rank %d: the duration histogram counted %d allreduces, want %d", r, h.GetSampleCount(), calls)
		}
		if sum := h.GetSampleSum(); sum <= 0 || sum > walls[r].Seconds() {
			t.Errorf("rank %d: the durations sum to %vs, outside (0, %v], the wall time around the calls", r, sum, walls[r])
		}
		var shares float64
		for _, m := range fams["gyre_share_samples"].GetMetric() {
			shares += m.GetGauge().GetValue()
		}
		if shares != batch || len(fams["gyre_share_samples"].GetMetric()) != n {
			t.Errorf("rank %d: %d share series summing to %v, want %d summing to the global batch %d",
				r, len(fams["gyre_share_samples"].GetMetric()), shares, n, batch)
		}
		if got := value(t, fams, "gyre_iteration", nil); got != iters {
			t.Errorf("rank %d: gyre_iteration %v, want %d", r, got, iters)
		}
		if got := value(t, fams, "gyre_refused_connections_total", nil); (r == 0) != (got > 0) {
			t.Errorf("rank %d: gyre_refused_connections_total %v; only rank 0 was dialled with another key", r, got)
		}
		if got := value(t, fams, "gyre_rank", nil); got != float64(r) {
			t.Errorf("rank %d: gyre_rank %v", r, got)
		}
		other := fmt.Sprint(1 - r)
		if age := value(t, fams, "gyre_heartbeat_age_seconds", map[string]string{"rank": other}); age < 0 || age > gyre.DefaultPeerTimeout.Seconds() {
			t.Errorf("rank %d: rank %s's heartbeat is %vs old, want within the peer timeout", r, other, age)
		}
		if got := len(fams["gyre_heartbeat_age_seconds"].GetMetric()); got != n-1 {
			t.Errorf("rank %d: %d heartbeat series, want one per other member", r, got)
		}
		bh := series(t, fams, "gyre_boundary_duration_seconds", map[string]string{"outcome": "next"}).GetHistogram()
		if bh.GetSampleCount() != iters {
			t.Errorf("rank %d: %d boundaries counted, want %d", r, bh.GetSampleCount(), iters)
		}
	}
}

// TestMetricsAddrTaken: a metrics port in use fails Join with ErrConfig
// naming the address.
func TestMetricsAddrTaken(t *testing.T) {
	c := gyretest.MakeCluster(t, gyretest.Options{N: 1, Config: func(_ int, c *gyre.Config) { c.MetricsAddr = "127.0.0.1:0" }})
	taken := c.Workers[0].MetricsAddr()
	cfg := gyre.Config{MetricsAddr: taken}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := gyre.Join(ctx, cfg)
	if err == nil {
		w.Close()
		t.Fatalf("Join served metrics on %s, which another worker holds", taken)
	}
	if !errors.Is(err, gyre.ErrConfig) || !regexp.MustCompile(regexp.QuoteMeta(taken)).MatchString(err.Error()) {
		t.Fatalf("Join with a taken metrics port: %v; want ErrConfig naming %s", err, taken)
	}
}

// documentedMetrics lists the gyre_ metric names docs/operations.md
// documents.
func documentedMetrics(t *testing.T) []string {
	t.Helper()
	doc, err := os.ReadFile("docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range regexp.MustCompile("`(gyre_[a-z_]+)`").FindAllStringSubmatch(string(doc), -1) {
		if !slices.Contains(names, m[1]) {
			names = append(names, m[1])
		}
	}
	if len(names) < 10 {
		t.Fatalf("docs/operations.md documents %d gyre_ metrics: %v", len(names), names)
	}
	return names
}

func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	client := http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %s", resp.Status)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// series returns name's series with every label of labels.
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	for _, m := range fams[name].GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range labels {
			match = match && have[k] == v
		}
		if match {
			return m
		}
	}
	t.Fatalf("no %s series with labels %v", name, labels)
	return nil
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	t.Helper()
	m := series(t, fams, name, labels)
	switch {
	case m.Counter != nil:
		return m.GetCounter().GetValue()
	case m.Gauge != nil:
		return m.GetGauge().GetValue()
	}
	t.Fatalf("%s is neither a counter nor a gauge", name)
	return 0
}

// iterate runs w's iterations until iters: Batch, then body (if any),
// Wait, Boundary and Commit.
func iterate(ctx context.Context, w *gyre.Worker, iters int64, body func() error) error {
	for w.Iter() < iters {
		w.Batch()
		if body != nil {
			if err := body(); err != nil {
				return err
			}
		}
		if err := w.Wait(ctx); err != nil {
			return err
		}
		if _, err := w.Boundary(ctx); err != nil {
			return err
		}
		if err := w.Commit(); err != nil {
			return err
		}
	}
	return nil
}
