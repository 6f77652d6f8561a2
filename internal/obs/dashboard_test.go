package obs

import (
	"encoding/json"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/gyre-ml/gyre/ring"
)

// TestDashboardUsesExportedMetrics scans every query of the Grafana
// dashboard in deploy/grafana for gyre_ identifiers and checks that each
// is a metric Metrics exports (a histogram's _bucket, _sum and _count
// included), so the dashboard cannot drift from the binary.
func TestDashboardUsesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/grafana/gyre.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/gyre.json: %v", err)
	}
	exported := exportedNames(t)
	ident := regexp.MustCompile(`\bgyre_[a-z0-9_]+`)
	used := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			for _, name := range ident.FindAllString(q.Expr, -1) {
				used++
				if !exported[name] {
					t.Errorf("panel %q queries %s, which the runtime does not export", p.Title, name)
				}
			}
		}
	}
	if used < 10 {
		t.Fatalf("the dashboard queries %d gyre_ metrics; the scan found too few to mean anything", used)
	}
}

// exportedNames is every sample name Metrics serves once each kind of
// event has been reported.
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	m := NewMetrics("mem")
	m.WatchHeartbeats(func(report func(int, time.Duration)) { report(1, time.Second) }, 0)
	m.WatchRefusals(func() uint64 { return 1 })
	m.Collective(ring.CollectiveStats{Algo: ring.AlgoRing, Bytes: 8})
	for _, b := range []Boundary{
		{Iter: 0, Next: 1, Members: 2, Shares: []int{1, 1}},
		{Iter: 1, Next: 2, Members: 2, Shares: []int{1, 1}, ViewChanged: true},
		{Iter: 2, Next: 1, Members: 1, Shares: []int{2}, ViewChanged: true, Redo: true},
		{Iter: 1, Err: errors.New("failed")},
	} {
		m.Boundary(b)
	}
	fams, err := m.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "gyre_") {
			continue
		}
		names[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		}
	}
	return names
}
