package integration

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
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
