package obs

import (
	"encoding/json"
	"html/template"
	"net/http"
	"strconv"
	"time"
)

// Status is what a worker's status page shows, and /status.json serves.
type Status struct {
	// Worker is this worker's name, Rank its rank in the view of Epoch.
	Worker string `json:"worker"`
	Rank   int    `json:"rank"`
	Epoch  uint64 `json:"epoch"`
	// Iteration is the iteration this worker runs next.
	Iteration int64 `json:"iteration"`
	// GlobalBatch is the sum of the shares.
	GlobalBatch   int     `json:"global_batch"`
	SamplesPerSec float64 `json:"samples_per_sec"`
	// BusBW is the bus bandwidth of the last allreduce of at least
	// busBWMinBytes, in bytes per second: 2(n−1)/n of its bytes over its
	// time, the figure nccl-tests reports. 0 before any.
	BusBW       float64 `json:"busbw_bytes_per_sec"`
	Recoveries  int     `json:"recoveries"`
	ViewChanges int     `json:"view_changes"`
	// LastRecovery is when the last recovery ended, if there was one.
	LastRecovery *time.Time `json:"last_recovery,omitempty"`
	// Stalls counts stall reports; LastStall is the latest.
	Stalls    int            `json:"stalls"`
	LastStall *StallStatus   `json:"last_stall,omitempty"`
	Members   []MemberStatus `json:"members"`
	// Updated is when the last boundary returned; zero before the first.
	Updated time.Time `json:"updated"`
}

// StallStatus is a stall report, for the status page.
type StallStatus struct {
	At            time.Time `json:"at"`
	Collective    string    `json:"collective"`
	Iteration     int64     `json:"iteration"`
	WaitedSeconds float64   `json:"waited_seconds"`
	Behind        []int     `json:"behind"`
	Pending       []string  `json:"pending"`
}

// MemberStatus is one member of the view, as this worker sees it.
type MemberStatus struct {
	Rank int    `json:"rank"`
	Name string `json:"name"`
	// State is "self" for this worker; for the others "alive", or
	// "silent" once their last heartbeat is older than the peer timeout.
	State string `json:"state"`
	Share int    `json:"share"`
	// ComputeSeconds is the member's compute time in the last iteration,
	// from the boundary's table; HeartbeatAgeSeconds how long ago its
	// last heartbeat arrived (none for this worker).
	ComputeSeconds      *float64 `json:"compute_seconds,omitempty"`
	HeartbeatAgeSeconds *float64 `json:"heartbeat_age_seconds,omitempty"`
}

// busBWMinBytes is the least allreduce Status.BusBW is taken from: smaller
// ones measure latency, not bandwidth.
const busBWMinBytes = 256 << 10

// Member states.
const (
	StateSelf   = "self"
	StateAlive  = "alive"
	StateSilent = "silent"
)

// status is the part of Status that boundaries update, under Metrics.mu.
type status struct {
	Status
	names    []string
	shares   []int
	computes []time.Duration
}

func (st *status) update(b Boundary, samplesPerSec float64, now time.Time) {
	st.Rank, st.Epoch, st.Iteration, st.Updated = b.Rank, b.Epoch, b.Next, now
	if samplesPerSec > 0 {
		st.SamplesPerSec = samplesPerSec
	}
	if b.Redo {
		st.Recoveries++
		st.LastRecovery = &now
	}
	if b.ViewChanged {
		st.ViewChanges++
	}
	st.names = append(st.names[:0], b.MemberNames...)
	st.shares = append(st.shares[:0], b.Shares...)
	st.computes = append(st.computes[:0], b.Computes...)
}

// Status returns the worker's status now: what the last boundary left,
// the last large allreduce's bus bandwidth, and the heartbeat ages read
// at this moment.
func (m *Metrics) Status() Status {
	ages := map[int]time.Duration{}
	if m.ages != nil {
		m.ages(func(rank int, age time.Duration) { ages[rank] = age })
	}
	m.lastBig.Lock()
	bytes, ranks, took := m.lastBig.bytes, m.lastBig.ranks, m.lastBig.took
	m.lastBig.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.st.Status
	if bytes > 0 && took > 0 && ranks > 1 {
		n := float64(ranks)
		s.BusBW = 2 * (n - 1) / n * float64(bytes) / took.Seconds()
	}
	if s.LastRecovery != nil {
		t := *s.LastRecovery
		s.LastRecovery = &t
	}
	s.Members = make([]MemberStatus, len(m.st.names))
	s.GlobalBatch = 0
	for r, name := range m.st.names {
		ms := MemberStatus{Rank: r, Name: name, State: StateAlive}
		if r < len(m.st.shares) {
			ms.Share = m.st.shares[r]
			s.GlobalBatch += ms.Share
		}
		if r < len(m.st.computes) {
			c := m.st.computes[r].Seconds()
			ms.ComputeSeconds = &c
		}
		if age, ok := ages[r]; ok {
			a := age.Seconds()
			ms.HeartbeatAgeSeconds = &a
			if m.silentAfter > 0 && age > m.silentAfter {
				ms.State = StateSilent
			}
		}
		if r == s.Rank {
			ms.State = StateSelf
			s.Worker = name
		}
		s.Members[r] = ms
	}
	return s
}

// statusJSON serves Status as JSON.
func (m *Metrics) statusJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(m.Status())
}

// statusPage serves Status as a page that reloads itself every two
// seconds. It links no external asset, so it works on a cluster with no
// internet, and it is rendered on the server, so it needs no script.
func (m *Metrics) statusPage(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	s := m.Status()
	statusTemplate.Execute(w, struct {
		Status
		Age string
	}{s, ago(s.Updated)})
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "no boundary yet"
	}
	return time.Since(t).Round(time.Millisecond).String() + " ago"
}

var statusTemplate = template.Must(template.New("status").Funcs(template.FuncMap{
	"ms": func(v *float64) string {
		if v == nil {
			return "–"
		}
		return strconv.FormatFloat(*v*1e3, 'f', 1, 64)
	},
	"gbps": func(v float64) string {
		if v == 0 {
			return "–"
		}
		return strconv.FormatFloat(v/1e9, 'f', 3, 64) + " GB/s"
	},
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<title>gyre {{.Worker}}: iteration {{.Iteration}}</title>
<style>
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em;margin:0 0 .3em}
p.sum span{margin-right:1.5em}
table{border-collapse:collapse;margin:1em 0}
th,td{padding:.25em .9em;border-bottom:1px solid #ddd;text-align:right}
th{background:#f3f3f3}
.l{text-align:left}
tr.self{font-weight:600}
tr.silent td{color:#b00000}
small{color:#666}
</style></head>
<body>
<h1>gyre worker {{.Worker}}</h1>
<p class="sum"><span id="rank">rank {{.Rank}} of {{len .Members}}</span><span id="epoch">epoch {{.Epoch}}</span><span id="iteration">iteration {{.Iteration}}</span><span id="batch">global batch {{.GlobalBatch}}</span><span id="sps">{{printf "%.0f" .SamplesPerSec}} samples/s</span><span id="busbw">busbw {{gbps .BusBW}}</span><span id="recoveries">{{.Recoveries}} recoveries{{if .LastRecovery}}, the last at {{.LastRecovery.UTC.Format "15:04:05"}} UTC{{end}}</span><span id="updated">{{.Age}}</span></p>
<table id="members">
<tr><th>rank</th><th class="l">member</th><th class="l">state</th><th>share</th><th>compute (ms)</th><th>last heartbeat (ms ago)</th></tr>
{{range .Members}}<tr class="member {{.State}}"><td>{{.Rank}}</td><td class="l">{{.Name}}</td><td class="l">{{.State}}</td><td class="share">{{.Share}}</td><td>{{ms .ComputeSeconds}}</td><td>{{ms .HeartbeatAgeSeconds}}</td></tr>
{{else}}<tr><td colspan="6" class="l">no boundary yet: the members show once the first iteration ends</td></tr>
{{end}}</table>
{{with .LastStall}}<p id="stall">{{$.Stalls}} stall reports; the last at {{.At.UTC.Format "15:04:05"}} UTC: waited {{printf "%.0f" .WaitedSeconds}} s in the {{.Collective}} of iteration {{.Iteration}} for ranks {{.Behind}}, with tensors {{.Pending}} pending</p>{{end}}
<p><small>Every worker serves this page; it reloads every 2 s. <a href="/status.json">status.json</a> · <a href="/metrics">metrics</a></small></p>
</body></html>
`))
