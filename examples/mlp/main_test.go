package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/launch"
	"github.com/gyre-ml/gyre/internal/secret"
)

func TestMain(m *testing.M) { gyretest.Main(m) }

// launchExample runs the example as n processes over real QUIC on
// loopback, as `gyre launch` does, and returns rank 0's output. The
// workers are a plain build of the example, as the integration tests'
// are of gyre: training to the target under the race detector took a
// minute, and the runtime they run is race-checked in process by the
// root package's tests.
func launchExample(t *testing.T, n int, args ...string) string {
	t.Helper()
	exe := gyretest.Build(t, "github.com/gyre-ml/gyre/examples/mlp")
	key, err := secret.Generate()
	if err != nil {
		t.Fatal(err)
	}
	peers, err := launch.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	err = launch.Run(ctx, launch.Options{
		N:    n,
		Argv: append([]string{exe}, args...),
		Env: func(r int) []string {
			return append(os.Environ(), gyre.EnvKey+"="+key.Hex(),
				gyre.EnvPeers+"="+strings.Join(peers, ","), gyre.EnvRank+"="+strconv.Itoa(r),
				gyre.EnvWorldSize+"="+strconv.Itoa(n))
		},
		Stdout: &out, Stderr: &errb,
	})
	if err != nil {
		t.Fatalf("%d workers: %v\nstdout:\n%s\nstderr:\n%s", n, err, out.String(), errb.String())
	}
	return out.String()
}

var summary = regexp.MustCompile(`\[0\] (\d+) workers, overlap (true|false): (\d+) iterations in \S+, ([0-9.]+)% test accuracy`)

// TestReachesTargetAccuracy is the accuracy check of the built-in task:
// the example reaches 95% test accuracy with one worker and with four over
// real QUIC. (internal/mlp checks that softmax regression stays below 80%
// on the same data.)
func TestReachesTargetAccuracy(t *testing.T) {
	for _, n := range []int{1, 4} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			out := launchExample(t, n, "--target-acc", "0.95", "--iters", "2000", "--eval-every", "100")
			m := summary.FindStringSubmatch(out)
			if m == nil {
				t.Fatalf("no summary in:\n%s", out)
			}
			acc, _ := strconv.ParseFloat(m[4], 64)
			if m[1] != strconv.Itoa(n) || acc < 95 {
				t.Fatalf("%s workers reached %.2f%%, want %d workers at >= 95%%:\n%s", m[1], acc, n, out)
			}
			t.Logf("%s", m[0])
		})
	}
}

// TestOverlapOff checks that --overlap=false trains the same model: the
// buckets are the same, only sent later.
func TestOverlapOff(t *testing.T) {
	on := launchExample(t, 2, "--iters", "100", "--eval-every", "100", "--target-acc", "1")
	off := launchExample(t, 2, "--iters", "100", "--eval-every", "100", "--target-acc", "1", "--overlap=false")
	line := regexp.MustCompile(`iter +100 +loss \S+ +test accuracy \S+`)
	a, b := line.FindString(on), line.FindString(off)
	if a == "" || a != b {
		t.Fatalf("overlap on: %q, off: %q", a, b)
	}
	if !strings.Contains(off, "overlap false") {
		t.Fatalf("summary does not say overlap false:\n%s", off)
	}
}
