package integration

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	quicgo "github.com/quic-go/quic-go"

	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport/quic"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// The flood test: a training job's data port and gossip port take 10,000
// connection attempts each, from a client of another cluster, while the
// job trains.

const floodAttempts = 10_000

// TestFlood floods rank 0's data port (TLS handshakes with another
// cluster's certificate over tcp, QUIC handshakes likewise over quic) and
// its gossip port (TCP connections sending junk) while a 3-worker job
// trains. Training goes on, no worker reports a lost peer, the flooded
// process's RSS grows by at most 64 MiB, and its log holds at most 10
// lines about the flood per port in any 10 s.
func TestFlood(t *testing.T) {
	longOnly(t)
	for _, tr := range []string{"tcp", "quic"} {
		t.Run(tr, func(t *testing.T) { testFlood(t, tr) })
	}
}

func testFlood(t *testing.T, tr string) {
	key := gyretest.Key(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 3, Gossip: true, Transport: tr, Key: func(int) string { return key },
		Argv: trainArgv(gyretest.Gyre(t), 100_000_000)})
	waitFor(t, time.Minute, "the job to train", func() bool { return progress.MatchString(p.Stdout(0)) })
	pid := p.Pid(0)
	before := rss(t, pid)
	intruder := intruderTLS(t)

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			peak.Store(max(peak.Load(), rss(t, pid)))
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	iterBefore := lastIter(p.Stdout(0))
	start := time.Now()
	var wg sync.WaitGroup
	var dataOK, gossipOK atomic.Int64
	wg.Go(func() { dataOK.Store(int64(floodData(tr, p.Peers[0], intruder))) })
	wg.Go(func() { gossipOK.Store(int64(floodGossip(p.GossipAddrs[0]))) })
	wg.Wait()
	took := time.Since(start)
	iterAfterFlood := lastIter(p.Stdout(0))
	if iterAfterFlood <= iterBefore {
		t.Fatalf("no iteration was reported during the flood (before %d, after %d)", iterBefore, iterAfterFlood)
	}
	// Training goes on after the flood, too.
	waitFor(t, time.Minute, "training to go on after the flood", func() bool { return lastIter(p.Stdout(0)) > iterAfterFlood+100 })
	close(stop)
	<-sampled
	growth := peak.Load() - before
	t.Logf("%s: %d connection attempts to the data port and %d to the gossip port in %v, while rank 0 went from iteration %d to %d; RSS %d MiB before, peak %d MiB (+%d MiB)",
		tr, dataOK.Load(), gossipOK.Load(), took.Round(time.Millisecond), iterBefore, iterAfterFlood, before>>20, peak.Load()>>20, growth>>20)
	for r := range 3 {
		if s := p.Stderr(r); strings.Contains(s, "lost rank") || strings.Contains(s, "PeerLost") {
			t.Fatalf("process %d reported a lost peer during the flood:\n%s", r, s)
		}
	}
	if dataOK.Load() < floodAttempts*9/10 || gossipOK.Load() < floodAttempts*9/10 {
		t.Fatalf("only %d and %d of %d connection attempts were made", dataOK.Load(), gossipOK.Load(), floodAttempts)
	}
	if growth > 64<<20 {
		t.Fatalf("RSS grew by %d MiB, at most 64 allowed", growth>>20)
	}
	data, gossip := floodLines(t, p.Stderr(0))
	t.Logf("%d lines about the data port's flood, %d about the gossip port's:\n%s", len(data), len(gossip), warnings(p.Stderr(0)))
	for _, port := range []struct {
		name  string
		times []time.Time
	}{{"data", data}, {"gossip", gossip}} {
		if len(port.times) == 0 {
			t.Fatalf("the %s port's flood left no trace in the log:\n%s", port.name, p.Stderr(0))
		}
		if n, at := densest(port.times, 10*time.Second); n > 10 {
			t.Fatalf("%d lines about the %s port's flood in the 10 s from %v:\n%s", n, port.name, at, p.Stderr(0))
		}
	}
}

// intruderTLS is the client TLS configuration of a worker of another
// cluster that skips checking the server, so that the server's own check
// refuses it.
func intruderTLS(t *testing.T) *tls.Config {
	c := transporttest.Issue(t, transporttest.NewCA(t), "intruder").ClientTLS(quic.ALPN)
	c.InsecureSkipVerify = true
	return c
}

// floodData makes floodAttempts handshakes with addr's data port, 32 at a
// time, and returns how many connections it opened.
func floodData(tr, addr string, intruder *tls.Config) int {
	var opened atomic.Int64
	each(floodAttempts, 32, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if tr == "quic" {
			conn, err := quicgo.DialAddr(ctx, addr, intruder, nil)
			opened.Add(1)
			if err == nil {
				select {
				case <-conn.Context().Done():
				case <-ctx.Done():
				}
				conn.CloseWithError(0, "")
			}
			return
		}
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err != nil {
			return
		}
		opened.Add(1)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		tls.Client(c, intruder).HandshakeContext(ctx)
		c.Close()
	})
	return int(opened.Load())
}

// floodGossip opens floodAttempts TCP connections to a gossip port, 32 at
// a time, each sending junk, and returns how many it opened.
func floodGossip(addr string) int {
	var opened atomic.Int64
	each(floodAttempts, 32, func() {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			return
		}
		opened.Add(1)
		junk := make([]byte, 256)
		rand.Read(junk)
		c.SetDeadline(time.Now().Add(5 * time.Second))
		c.Write(junk)
		c.Close()
	})
	return int(opened.Load())
}

// each runs f n times on k goroutines.
func each(n, k int, f func()) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range k {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				f()
			}
		})
	}
	wg.Wait()
}

// rss returns the resident set size of process pid in bytes.
func rss(t *testing.T, pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Errorf("reading the RSS: %v", err)
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// lastIter returns the last iteration rank 0 reported, or -1.
func lastIter(stdout string) int {
	m := progress.FindAllStringSubmatch(stdout, -1)
	if len(m) == 0 {
		return -1
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}

// floodLines returns the times of the log lines about refused input to
// the data port (the transport's) and to the gossip port (membership's),
// at warning level and up.
func floodLines(t *testing.T, stderr string) (data, gossip []time.Time) {
	t.Helper()
	for _, line := range strings.Split(stderr, "\n") {
		var l struct {
			Level     string    `json:"level"`
			Time      time.Time `json:"time"`
			Transport string    `json:"transport"`
			Component string    `json:"component"`
		}
		if json.Unmarshal([]byte(line), &l) != nil || (l.Level != "warn" && l.Level != "error") {
			continue
		}
		switch {
		case l.Transport != "":
			data = append(data, l.Time)
		case l.Component == "membership":
			gossip = append(gossip, l.Time)
		}
	}
	return data, gossip
}

// densest returns the most lines within any span of length d, and when
// that span begins. Times have a resolution of a second, so a span covers
// the seconds [at, at+d).
func densest(times []time.Time, d time.Duration) (int, time.Time) {
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	best, at := 0, time.Time{}
	for i := range times {
		n := 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < d; j++ {
			n++
		}
		if n > best {
			best, at = n, times[i]
		}
	}
	return best, at
}

// warnings returns the lines of a JSON log at warning level and up.
func warnings(stderr string) string {
	var out []string
	for _, line := range strings.Split(stderr, "\n") {
		if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
