package integration

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/checkpoint"
)

// TestKillAllAndRestartProcs: a 4-worker gyre train job with a
// checkpoint every 20 iterations is stopped whole (SIGSTOP to every
// worker, so that none recovers, then SIGKILL to all) and started again
// from copies of its directories:
//   - with 4 workers, it resumes from the newest checkpoint, says so, and
//     ends with the digest of an uninterrupted run (static balance and a
//     fixed ring make the sums the same);
//   - with 2 workers (the directories of ranks 0 and 1) and with 6 (two
//     with empty directories), its final parameters are within 1e-12 of
//     a single worker's.
func TestKillAllAndRestartProcs(t *testing.T) {
	longOnly(t)
	gyre := gyretest.Gyre(t)
	const iters = "600"
	root := t.TempDir()
	ckdir := func(set string, r int) string { return filepath.Join(root, set, fmt.Sprintf("w%d", r)) }
	argv := func(set string) func(int) []string {
		if err := os.MkdirAll(filepath.Join(root, set), 0o700); err != nil {
			t.Fatal(err)
		}
		return func(r int) []string {
			a := []string{gyre, "--log-level", workerLogLevel(), "train", "--iters", iters, "--target-acc", "0", "--eval-every", "300",
				"--balance", "static", "--ring-order", "fixed", "--save-params", paramsFile(filepath.Join(root, set), r)}
			if r >= 0 { // the single-worker reference run keeps none
				a = append(a, "--checkpoint-dir", ckdir(set, r), "--checkpoint-every", "20")
			}
			return a
		}
	}
	finish := func(t *testing.T, p *gyretest.Procs, n int) map[string]bool {
		t.Helper()
		digests := map[string]bool{}
		for _, res := range waitAll(t, p, 2*time.Minute) {
			m := digestLine.FindStringSubmatch(res.Stdout)
			if res.Code != 0 || m == nil || m[3] != iters {
				t.Fatalf("rank %d exited %d; want 0 after iteration %s:\n%s\n%s", res.Rank, res.Code, iters, res.Stdout, lastLines(res.Stderr, 20))
			}
			digests[m[2]] = true
		}
		if len(digests) != 1 {
			t.Fatalf("%d workers ended with %d digests", n, len(digests))
		}
		return digests
	}

	whole := finish(t, gyretest.StartProcs(t, gyretest.ProcOptions{N: 4, Gossip: true, Argv: argv("whole")}), 4)

	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 4, Gossip: true, Argv: argv("crash")})
	newest := waitForCheckpoint(t, ckdir("crash", 0), 200, time.Minute)
	for r := range 4 {
		p.Stop(t, r)
	}
	for r := range 4 {
		p.Kill(t, r)
	}
	waitAll(t, p, time.Minute)
	infos, err := (checkpoint.Dir{Path: ckdir("crash", 0)}).List()
	if err != nil || len(infos) == 0 || infos[0].Iter >= 600 {
		t.Fatalf("the stopped job left %v, %v; want checkpoints before iteration 600", infos, err)
	}
	t.Logf("stopped whole with its newest checkpoint at iteration %d (first seen at %d)", infos[0].Iter, newest)

	for _, tc := range []struct {
		set string
		n   int
	}{{"four", 4}, {"two", 2}, {"six", 6}} {
		t.Run(tc.set, func(t *testing.T) {
			for r := range min(tc.n, 4) {
				copyDir(t, ckdir("crash", r), ckdir(tc.set, r))
			}
			args := argv(tc.set)
			p := gyretest.StartProcs(t, gyretest.ProcOptions{N: tc.n, Gossip: true, Argv: args})
			digests := finish(t, p, tc.n)
			if !strings.Contains(p.Stdout(0), "# resumed from checkpoint") {
				t.Errorf("rank 0 does not say it resumed:\n%s", p.Stdout(0))
			}
			if tc.n == 4 {
				for d := range digests {
					if !whole[d] {
						t.Errorf("resumed on 4 workers, the job ended with digest %s; the uninterrupted run with %v", d, whole)
					}
				}
				return
			}
			ranks := make([]int, tc.n)
			for r := range ranks {
				ranks[r] = r
			}
			matchSingleWorker(t, filepath.Join(root, tc.set), args, ranks...)
		})
	}
}

// waitForCheckpoint waits until dir holds a checkpoint of iteration at
// least iter, and returns the newest one's iteration.
func waitForCheckpoint(t *testing.T, dir string, iter int64, limit time.Duration) int64 {
	t.Helper()
	for deadline := time.Now().Add(limit); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if infos, err := (checkpoint.Dir{Path: dir}).List(); err == nil && len(infos) > 0 && infos[0].Iter >= iter {
			return infos[0].Iter
		}
	}
	t.Fatalf("%s holds no checkpoint of iteration %d or later after %v", dir, iter, limit)
	return 0
}

// copyDir copies the regular files of src into dst, which it creates.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.MkdirAll(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	ents, err := os.ReadDir(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.OpenFile(filepath.Join(dst, e.Name()), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.Copy(out, in)
		in.Close()
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
