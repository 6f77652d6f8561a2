package integration

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// TestOneCommandForEveryWorker: every worker gets the same command, as a
// StatefulSet's pods or a Slurm job's tasks do: every gossip address as
// seeds, the starter's first, --min-workers 3, and a checkpoint
// directory of its own. The others come up first and gossip among
// themselves; the starter starts the job when it comes up. Then the
// starter is killed (-9) and started again with the same command, as a
// restarted pod 0: it joins the running job, ignoring its own
// checkpoints, rather than starting a second job, and all three end with
// one digest.
func TestOneCommandForEveryWorker(t *testing.T) {
	longOnly(t)
	gyre := gyretest.Gyre(t)
	const iters = 20000
	dir := t.TempDir()
	argv := func(r int) []string {
		return []string{gyre, "--log-level", "info", "--log-format", "json", "train", "--iters", strconv.Itoa(iters),
			"--target-acc", "0", "--hidden", "16", "--batch", "48", "--eval-every", "1000", "--peer-timeout", "1s",
			"--quorum-timeout", "30s", "--checkpoint-dir", filepath.Join(dir, "ckpt-"+strconv.Itoa(r)), "--checkpoint-every", "500"}
	}
	p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 3, Gossip: true, SharedSeeds: true, Argv: argv})
	waitForRow(t, p, 0, time.Minute)
	if !strings.Contains(p.Stderr(0), "started a new job") {
		t.Fatalf("the first seed did not start the job:\n%s", p.Stderr(0))
	}
	for r := 1; r < 3; r++ {
		if strings.Contains(p.Stderr(r), "started a new job") {
			t.Fatalf("process %d, not the first seed, started a job:\n%s", r, p.Stderr(r))
		}
	}
	waitForCheckpoint(t, filepath.Join(dir, "ckpt-0"), 500, time.Minute)
	p.Kill(t, 0)
	p.Restart(t, 0)
	waitFor(t, time.Minute, "the restarted starter to find the running job", func() bool {
		return strings.Contains(p.Stderr(0), "the job is running: joining it") || strings.Contains(p.Stderr(0), "started a new job")
	})
	if strings.Contains(p.Stderr(0), "started a new job") {
		t.Fatalf("the restarted starter started a second job:\n%s", p.Stderr(0))
	}
	res := waitAll(t, p, 3*time.Minute)
	finalDigests(t, res, iters)
	if strings.Contains(res[0].Stdout, "resumed from") {
		t.Errorf("the restarted starter, admitted after iteration 0, resumed from its own checkpoint:\n%s", res[0].Stdout)
	}
}

// TestClusterDeployRecipe follows docs/deploy.md's by-hand recipe on 3
// namespace hosts: the same command on each, every host a seed, host 1's
// first; gyre members from a 4th host lists the job; host 1's worker,
// the starter, killed (-9) and started again with the same command as a
// restarted pod 0 would be, rejoins the job rather than starting a second
// one; and the job trains to the target accuracy, all three hosts ending
// with one digest.
func TestClusterDeployRecipe(t *testing.T) {
	j := upNS(t, 4)
	var seeds []string
	for i := 1; i <= 3; i++ {
		seeds = append(seeds, j.addr(t, i)+":7946")
		// Half a core each bounds the job's speed on a faster machine,
		// so that the restart lands mid-job.
		j.cluster(t, "cpu", strconv.Itoa(i), "50")
	}
	dirs := t.TempDir()
	args := func(i int) []string {
		return []string{"--log-level", "info", "train", "--listen", j.addr(t, i) + ":7946", "--seed", strings.Join(seeds, ","),
			"--key-file", j.key, "--min-workers", "3", "--checkpoint-dir", filepath.Join(dirs, "host-"+strconv.Itoa(i)),
			// Beyond the recipe: a job that takes about 40 s to reach
			// the target (a wider, slower model on half a core each, and
			// a small learning rate), long enough to restart a worker in
			// and list it again even when gyre members is slow to answer
			// under load (at --lr 0.05 one CI run's job ended 6 s after
			// the restart, before the listing), and quick failure
			// detection.
			"--iters", "10000", "--target-acc", "0.97", "--hidden", "512", "--lr", "0.025", "--eval-every", "100",
			"--peer-timeout", "1s", "--transport", nsTransport()}
	}
	for i := 3; i >= 1; i-- {
		j.start(t, i, args(i)...)
	}
	waitFor(t, time.Minute, "host 1's first progress row", func() bool { return progress.MatchString(j.procs[0].out.String()) })
	if !strings.Contains(j.procs[0].err.String(), "started a new job") {
		t.Fatalf("host 1, the first seed, did not start the job:\n%s", j.procs[0].err.String())
	}
	j.members(t, 3, seeds[1])

	victim := j.procs[0]
	victim.cmd.Process.Kill()
	<-victim.done
	restarted, restartedAt := j.start(t, 1, args(1)...), time.Now()
	waitFor(t, time.Minute, "the restarted worker to find the job", func() bool {
		e := restarted.err.String()
		return strings.Contains(e, "the job is running: joining it") || strings.Contains(e, "started a new job")
	})
	if e := restarted.err.String(); strings.Contains(e, "started a new job") {
		t.Fatalf("the restarted starter started a second job:\n%s", e)
	}
	j.members(t, 3, seeds[2])
	t.Logf("the restarted starter is back in the job's view %v after its restart", time.Since(restartedAt).Round(100*time.Millisecond))

	j.finished(t, -1, 1, 2, 3)
	var verdict string
	for _, p := range j.procs[:3] {
		if m := regexp.MustCompile(`(?m)^# (reached the target|stopped at the iteration limit).*$`).FindString(p.out.String()); m != "" {
			verdict = m
		}
	}
	if !strings.HasPrefix(verdict, "# reached the target") {
		t.Errorf("the job did not train to the target: %q", verdict)
	}
	t.Log(verdict)
}

// members runs gyre members from host 4 through seed until it lists want
// workers, every one admitted into one view, or fails the test after a
// minute.
func (j *nsJob) members(t *testing.T, want int, seed string) {
	t.Helper()
	var last string
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
		out, err := exec.Command(j.sh, "run", "4", j.gyre, "--log-level", "warn", "members", "--seed", seed, "--key-file", j.key, "--json").Output()
		last = string(out)
		if err != nil {
			last += err.Error()
			continue
		}
		var rows []struct {
			Role    string
			State   string
			Epoch   uint64
			Pending bool
		}
		if err := json.Unmarshal(out, &rows); err != nil {
			t.Fatalf("gyre members --json: %v\n%s", err, out)
		}
		epochs := map[uint64]int{}
		for _, r := range rows {
			if r.Role == "worker" && r.State == "alive" && !r.Pending {
				epochs[r.Epoch]++
			}
		}
		if len(epochs) == 1 {
			for e, n := range epochs {
				if n == want && e > 0 {
					t.Logf("gyre members from host 4: %d workers in epoch %d", n, e)
					return
				}
			}
		}
	}
	t.Fatalf("gyre members from host 4 through %s never listed %d workers in one view:\n%s", seed, want, last)
}
