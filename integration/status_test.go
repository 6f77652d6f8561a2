package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/internal/obs"
)

// TestStatusPage runs 3 `gyre train` processes, each serving its status
// page, and loads rank 0's: over HTTP, the page lists the 3 members with
// shares summing to the global batch, and /status.json says the same.
// With GYRE_BROWSER_TESTS=1 headless Chromium (Debian's chromium package)
// loads the page too, and its rendered DOM must list them; with
// GYRE_SCREENSHOT=FILE it also leaves a screenshot there.
func TestStatusPage(t *testing.T) {
	const n = 3
	addrs, err := launch.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	gyreBin := gyretest.Gyre(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: n, Gossip: true,
		Argv: func(int) []string { return []string{gyreBin, "train", "--iters", "1000000", "--target-acc", "0"} },
		Env:  func(r int) []string { return []string{gyre.EnvMetricsAddr + "=" + addrs[r]} },
	})
	url := "http://" + addrs[0] + "/"
	var st obs.Status
	deadline := time.Now().Add(time.Minute)
	for {
		st = obs.Status{}
		if body, err := get(url + "status.json"); err == nil {
			json.Unmarshal(body, &st)
		}
		if len(st.Members) == n && st.Iteration > 5 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rank 0's status.json never listed %d members past iteration 5: %+v\n%s", n, st, p.Stderr(0))
		}
		time.Sleep(100 * time.Millisecond)
	}
	if st.GlobalBatch != gyre.DefaultGlobalBatch || st.Members[0].State != obs.StateSelf || st.Members[1].State != obs.StateAlive {
		t.Fatalf("status.json: %+v", st)
	}
	page, err := get(url)
	if err != nil {
		t.Fatal(err)
	}
	checkMembersDOM(t, "the page over HTTP", page, n)

	if os.Getenv("GYRE_BROWSER_TESTS") == "" {
		t.Log("headless Chromium not run: set GYRE_BROWSER_TESTS=1 with Debian's chromium installed (apt-get install chromium)")
		return
	}
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("GYRE_BROWSER_TESTS is set but there is no chromium: %v", err)
	}
	// The flags keep Chromium off the network: the machine has none, and
	// its background requests would only be refused.
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--user-data-dir=" + t.TempDir()}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dom, err := exec.CommandContext(ctx, chromium, append(args, "--dump-dom", url)...).Output()
	if err != nil {
		t.Fatalf("chromium --dump-dom: %v", err)
	}
	checkMembersDOM(t, "Chromium's DOM", dom, n)
	if shot := os.Getenv("GYRE_SCREENSHOT"); shot != "" {
		out, err := exec.CommandContext(ctx, chromium, append(args, "--screenshot="+shot, "--window-size=1100,330", url)...).CombinedOutput()
		if err != nil {
			t.Fatalf("chromium --screenshot: %v\n%s", err, out)
		}
	}
}

// checkMembersDOM finds n member rows in a status page whose shares sum to
// the default global batch.
func checkMembersDOM(t *testing.T, what string, page []byte, n int) {
	t.Helper()
	rows := regexp.MustCompile(`<tr class="member (self|alive|silent)">`).FindAll(page, -1)
	shares := regexp.MustCompile(`<td class="share">(\d+)</td>`).FindAllSubmatch(page, -1)
	sum := 0
	for _, s := range shares {
		v, _ := strconv.Atoi(string(s[1]))
		sum += v
	}
	if len(rows) != n || len(shares) != n || sum != gyre.DefaultGlobalBatch {
		t.Fatalf("%s: %d member rows and %d shares summing to %d, want %d summing to %d:\n%s",
			what, len(rows), len(shares), sum, n, gyre.DefaultGlobalBatch, page)
	}
}

func get(url string) ([]byte, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// jobView is what the test reads of gyre status --json.
type jobView struct {
	Job         string
	Epoch       uint64
	Iteration   int64
	GlobalBatch int     `json:"global_batch"`
	SamplesPS   float64 `json:"samples_per_sec"`
	Loss        *float64
	Ranks       []rankView
	Pending     []struct{ ID string }
	Warnings    []string
}

type rankView struct {
	Rank      int
	ID, State string
	Share     int
	SamplesPS float64 `json:"samples_per_sec"`
	Loss      *float64
}

// TestGyreStatus: gyre status on a real 3-worker job, through rank 0's
// gossip, shows one view of 3 ranks, their shares summing to the global
// batch, samples/s and the trainer's loss. Rank 2 is then killed with -9
// and started again by its own command; the next call shows the view of
// the recovery and readmission, at a later epoch and iteration, with the
// new worker in it. The table form says the same.
func TestGyreStatus(t *testing.T) {
	longOnly(t)
	gyreBin := gyretest.Gyre(t)
	key := gyretest.Key(t)
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 3, Gossip: true, Key: func(int) string { return key },
		Argv: func(int) []string {
			return []string{gyreBin, "--log-level", "warn", "train", "--iters", "1000000", "--target-acc", "0", "--peer-timeout", "1s"}
		}})
	run := func(args ...string) ([]byte, error) {
		cmd := exec.Command(gyreBin, append([]string{"--log-level", "warn", "status", "--seed", p.GossipAddrs[0], "--wait", "500ms"}, args...)...)
		cmd.Env = append(os.Environ(), "GYRE_KEY="+key)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("gyre status: %w\n%s", err, stderr.String())
		}
		return out, nil
	}
	// settled waits for a published view of 3 ranks that satisfies ok.
	settled := func(what string, ok func(jobView) bool) jobView {
		t.Helper()
		var last []byte
		for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
			out, err := run("--json")
			if err != nil { // the seed may not listen yet
				last = []byte(err.Error())
				continue
			}
			last = out
			var jobs []jobView
			if err := json.Unmarshal(last, &jobs); err != nil {
				t.Fatalf("gyre status --json: %v\n%s", err, last)
			}
			if len(jobs) != 1 || len(jobs[0].Ranks) != 3 || jobs[0].GlobalBatch == 0 || len(jobs[0].Pending) > 0 || len(jobs[0].Warnings) > 0 {
				continue
			}
			js, sum := jobs[0], 0
			for r, rk := range js.Ranks {
				if rk.Rank != r || rk.State != "alive" || rk.Share <= 0 || rk.SamplesPS <= 0 || rk.Loss == nil {
					sum = -1
					break
				}
				sum += rk.Share
			}
			if sum == js.GlobalBatch && js.SamplesPS > 0 && js.Loss != nil && ok(js) {
				return js
			}
		}
		t.Fatalf("gyre status never showed %s:\n%s\n%s", what, last, p.Stderr(0))
		return jobView{}
	}
	first := settled("3 ranks of a running job", func(js jobView) bool { return js.Iteration > 0 })
	t.Logf("before: epoch %d iteration %d, %.0f samples/s, loss %.4f", first.Epoch, first.Iteration, first.SamplesPS, *first.Loss)
	out, err := run()
	if err != nil {
		t.Fatal(err)
	}
	table := string(out)
	for _, want := range []string{"JOB", "EPOCH", "ITERATION", "RANK", "SHARE", "SAMPLES/S", p.Peers[0], p.Peers[2]} {
		if !strings.Contains(table, want) {
			t.Fatalf("the table lacks %q:\n%s", want, table)
		}
	}
	p.Kill(t, 2)
	p.Restart(t, 2)
	second := settled("the view after the kill and readmission", func(js jobView) bool {
		return js.Epoch > first.Epoch+1 && js.Iteration > first.Iteration &&
			slices.ContainsFunc(js.Ranks, func(r rankView) bool { return r.ID == p.Peers[2] })
	})
	t.Logf("after: epoch %d iteration %d, %.0f samples/s, loss %.4f", second.Epoch, second.Iteration, second.SamplesPS, *second.Loss)
}
