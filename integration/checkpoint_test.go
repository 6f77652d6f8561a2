package integration

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
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
//     ends with the digest of an uninterrupted run (static balance, a
//     fixed ring order and a pinned algorithm make the sums the same:
//     under --algo auto each run measures its own threshold);
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
				"--balance", "static", "--ring-order", "fixed", "--algo", "ring", "--save-params", paramsFile(filepath.Join(root, set), r)}
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

// TestCheckpointWriterKilledMidFile: a lone gyre train process dies
// (GYRE_FAILPOINT=checkpoint@20:BYTES, as kill -9 would) while it writes
// the checkpoint of iteration 20, after 0 bytes, a few, half the file and
// nearly all of it. No file that reads as a checkpoint is partial:
// the directory's newest valid checkpoint is iteration 10's, with no
// damaged file to report, and a run started again resumes from it. (A
// process exit is not a power loss: this does not test the fsyncs.)
func TestCheckpointWriterKilledMidFile(t *testing.T) {
	longOnly(t)
	gyre := gyretest.Gyre(t)
	root := t.TempDir()
	run := func(dir, iters, failpoint string) (string, error) {
		cmd := exec.Command(gyre, "--log-level", "warn", "train", "--name", "w", "--iters", iters, "--target-acc", "0",
			"--eval-every", "1000", "--checkpoint-dir", dir, "--checkpoint-every", "10", "--balance", "static")
		cmd.Env = append(withoutGyreVars(), "GYRE_FAILPOINT="+failpoint)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	probe := filepath.Join(root, "probe")
	if out, err := run(probe, "10", ""); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	st, err := os.Stat(filepath.Join(probe, checkpoint.FileName(1, 10)))
	if err != nil {
		t.Fatal(err)
	}
	size := st.Size()
	// The header's time of writing varies by up to 9 bytes from one
	// checkpoint to the next (static balance keeps models out of it), so
	// the cuts near the end keep a margin; the package's own test cuts
	// every byte.
	for _, n := range []int64{0, 1, 16, 200, size / 2, size - 40, size - 20, size - 12} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			dir := filepath.Join(root, fmt.Sprint(n))
			out, err := run(dir, "40", fmt.Sprintf("checkpoint@20:%d", n))
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ProcessState.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
				t.Fatalf("the run with the failpoint ended with %v; want SIGKILL:\n%s", err, out)
			}
			s, name, bad := (checkpoint.Dir{Path: dir}).Newest()
			if s == nil || s.Iter != 10 || len(bad) != 0 {
				t.Fatalf("after dying %d bytes into the checkpoint of 20 (of %d): newest valid %q, damaged %v; want iteration 10 and nothing damaged", n, size, name, bad)
			}
			ents, _ := os.ReadDir(dir)
			temps := 0
			for _, e := range ents {
				if strings.HasSuffix(e.Name(), ".tmp") {
					temps++
				}
			}
			if temps != 1 {
				t.Errorf("the dead writer left %d temporary files, want its one: %v", temps, ents)
			}
			out, err = run(dir, "30", "")
			if err != nil || !strings.Contains(out, "resumed from checkpoint "+checkpoint.FileName(1, 10)) {
				t.Fatalf("started again: %v; want it to resume from iteration 10:\n%s", err, out)
			}
		})
	}
}

// TestCheckpointDiskFaultsProcs (root: it mounts): a lone gyre train
// whose checkpoint directory is a full tmpfs, or a read-only bind mount,
// logs an error line for each checkpoint it cannot write, naming the
// cause, and trains to the end; with --checkpoint-required it ends with
// that error instead.
func TestCheckpointDiskFaultsProcs(t *testing.T) {
	longOnly(t)
	if os.Getuid() != 0 {
		t.Skip("mounts a tmpfs and a read-only bind mount: run as root (CI does)")
	}
	gyre := gyretest.Gyre(t)
	root := t.TempDir()
	mount := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("mount", args...).CombinedOutput(); err != nil {
			t.Fatalf("mount %v: %v\n%s", args, err, out)
		}
	}
	full := filepath.Join(root, "full")
	ro := filepath.Join(root, "ro")
	for _, d := range []string{full, ro, ro + "-src"} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	// A checkpoint of the default model is about 89 KB: one fits, and the
	// next, written beside it, does not.
	mount("-t", "tmpfs", "-o", "size=150k", "tmpfs", full)
	t.Cleanup(func() { exec.Command("umount", full).Run() })
	mount("--bind", ro+"-src", ro)
	t.Cleanup(func() { exec.Command("umount", ro).Run() })
	mount("-o", "remount,bind,ro", ro)
	for _, tc := range []struct {
		name, dir, cause string
	}{{"full", full, "no space left on device"}, {"read-only", ro, "read-only file system"}} {
		t.Run(tc.name, func(t *testing.T) {
			run := func(extra ...string) (string, error) {
				cmd := exec.Command(gyre, append([]string{"--log-level", "warn", "train", "--iters", "50", "--target-acc", "0",
					"--eval-every", "1000", "--checkpoint-dir", tc.dir, "--checkpoint-every", "10"}, extra...)...)
				cmd.Env = withoutGyreVars()
				out, err := cmd.CombinedOutput()
				return string(out), err
			}
			out, err := run()
			failed := strings.Count(out, "checkpoint not written")
			if err != nil || !digestLine.MatchString(out) || failed < 2 || !strings.Contains(out, tc.cause) {
				t.Fatalf("%v, %d error lines; want it to train to the end, with a line per failed checkpoint naming %q:\n%s", err, failed, tc.cause, out)
			}
			t.Logf("%d checkpoints failed, each logged", failed)
			out, err = run("--checkpoint-required")
			if err == nil || digestLine.MatchString(out) || !strings.Contains(out, "checkpoint failed") || !strings.Contains(out, tc.cause) {
				t.Fatalf("with --checkpoint-required: %v; want it to end with the checkpoint's error (%s):\n%s", err, tc.cause, out)
			}
		})
	}
}
