package integration

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// slurmTestbed is a real Slurm cluster on namespace hosts
// (deploy/slurm/testbed.sh): a controller and nodes n1-n3 on hosts 1-3.
type slurmTestbed struct {
	*testbed
}

// upSlurm brings up the testbed and takes it down when the test ends,
// checking that nothing of it is left. PATH has the gyre under test
// first.
func upSlurm(t *testing.T) *slurmTestbed {
	t.Helper()
	s := &slurmTestbed{newTestbed(t, "real Slurm on namespace hosts", "deploy/slurm/testbed.sh", 5)}
	const dir = "/tmp/gyre-slurm-testbed"
	bin := t.TempDir()
	if err := os.Symlink(gyretest.Gyre(t), filepath.Join(bin, "gyre")); err != nil {
		t.Fatal(err)
	}
	s.env = append(s.env, "PATH="+bin+":"+os.Getenv("PATH"))
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := exec.Command("sh", "-c", "tail -n 15 "+dir+"/logs/*.log").CombinedOutput()
			t.Logf("Slurm's logs:\n%s", out)
		}
		if out, err := s.command(t, "", time.Minute, "down").CombinedOutput(); err != nil {
			t.Errorf("testbed down: %v\n%s", err, out)
		}
		s.leftovers(t, dir, dir+"/slurm.conf", dir+"/munge")
		if _, err := os.Stat("/etc/netns/gy5h1"); err == nil {
			t.Error("/etc/netns/gy5h1 survived the testbed")
		}
	})
	start := time.Now()
	if out, err := s.command(t, "", 2*time.Minute, "up").CombinedOutput(); err != nil {
		t.Fatalf("testbed up: %v\n%s", err, out)
	}
	t.Logf("Slurm up in %v", time.Since(start).Round(time.Millisecond))
	return s
}

// run runs a Slurm command on the controller's host, in dir, for up to a
// minute.
func (s *slurmTestbed) run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	out, err := s.command(t, dir, time.Minute, append([]string{"run"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// jobDir makes a job's working directory as docs/deploy.md has it: the
// cluster secret, and deploy/ (a link to the repository's).
func (s *slurmTestbed) jobDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	deploy, err := filepath.Abs("../deploy")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(deploy, filepath.Join(dir, "deploy")); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(gyretest.Gyre(t), "keygen", "--out", filepath.Join(dir, "cluster.key")).CombinedOutput(); err != nil {
		t.Fatalf("keygen: %v\n%s", err, out)
	}
	return dir
}

// sbatch submits deploy/slurm/gyre.sbatch on the 3 nodes from dir, with
// args for gyre train, and returns the job's ID.
func (s *slurmTestbed) sbatch(t *testing.T, dir string, args ...string) string {
	t.Helper()
	return s.run(t, dir, append([]string{"sbatch", "--parsable", "-N3", "-c2", "deploy/slurm/gyre.sbatch"}, args...)...)
}

var (
	jobState    = regexp.MustCompile(`JobState=(\S+)`)
	pastIter500 = regexp.MustCompile(`(?m)^\s+[5-9]\d\d\s`)
)

// waitJob waits up to limit for job id to end, and returns its state.
func (s *slurmTestbed) waitJob(t *testing.T, dir, id string, limit time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		out := s.run(t, dir, "scontrol", "show", "job", id)
		m := jobState.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("scontrol show job %s: no JobState:\n%s", id, out)
		}
		switch m[1] {
		case "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "RESIZING", "SUSPENDED":
		default:
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("job %s still %s after %v:\n%s", id, m[1], limit, readFile(t, filepath.Join(dir, "slurm-"+id+".out")))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return string(b)
}

// oneDigest checks that outs hold n final digests in all, one each from
// ranks 0..n-1, all equal, at iteration iters if it is not 0.
func oneDigest(t *testing.T, n int, iters string, outs ...string) string {
	t.Helper()
	var ranks, digests []string
	for _, out := range outs {
		for _, m := range digestLine.FindAllStringSubmatch(out, -1) {
			if iters != "" && m[3] != iters {
				t.Errorf("rank %s ended at iteration %s, want %s", m[1], m[3], iters)
			}
			ranks, digests = append(ranks, m[1]), append(digests, m[2])
		}
	}
	if len(digests) != n {
		t.Fatalf("%d final digests (ranks %v), want %d:\n%s", len(digests), ranks, n, strings.Join(outs, "\n----\n"))
	}
	for i, d := range digests {
		if d != digests[0] {
			t.Fatalf("rank %s's digest %s differs from rank %s's %s", ranks[i], d, ranks[0], digests[0])
		}
	}
	return digests[0]
}

// TestSlurmRecipe runs docs/deploy.md's Slurm recipe on a real Slurm
// (deploy/slurm/testbed.sh): the unmodified gyre.sbatch on 3 nodes ends
// COMPLETED with one digest. Then a second job's worker on n2 is killed
// (-9) and started again with the command docs/deploy.md gives, inside
// the job; it rejoins, and the job ends COMPLETED with one digest on
// every rank.
func TestSlurmRecipe(t *testing.T) {
	t.Parallel() // beside the other deploy testbed: each has its own hosts and directory
	s := upSlurm(t)

	dir := s.jobDir(t)
	start := time.Now()
	id := s.sbatch(t, dir)
	if state := s.waitJob(t, dir, id, 2*time.Minute); state != "COMPLETED" {
		t.Fatalf("job %s ended %s:\n%s", id, state, readFile(t, filepath.Join(dir, "slurm-"+id+".out")))
	}
	out := readFile(t, filepath.Join(dir, "slurm-"+id+".out"))
	oneDigest(t, 3, "", out)
	if !strings.Contains(out, "reached the target 97.00%") {
		t.Errorf("job %s did not reach gyre-worker.sh's target accuracy:\n%s", id, out)
	}
	t.Logf("gyre.sbatch: job %s COMPLETED in %v", id, time.Since(start).Round(time.Millisecond))

	// The second job runs long enough to lose a worker and admit it again.
	const iters = "6000"
	args := []string{"--iters", iters, "--target-acc", "0"}
	dir = s.jobDir(t)
	id = s.sbatch(t, dir, args...)
	log := filepath.Join(dir, "slurm-"+id+".out")
	waitFor(t, time.Minute, "job "+id+" to pass iteration 500", func() bool {
		return pastIter500.MatchString(readFile(t, log))
	})
	n2 := exec.Command("pkill", "-9", "-f", "--", "gyre train --listen "+s.addr(2)+":7946")
	if out, err := n2.CombinedOutput(); err != nil {
		t.Fatalf("kill -9 of n2's worker: %v\n%s", err, out)
	}
	killed := time.Now()
	// docs/deploy.md's restart, from the job's working directory, with
	// the job's arguments.
	var restart bytes.Buffer
	cmd := s.command(t, dir, 3*time.Minute, append([]string{"run", "srun", "--jobid", id, "--overlap", "-N1", "-w", "n2", "deploy/slurm/gyre-worker.sh"}, args...)...)
	cmd.Stdout, cmd.Stderr = &restart, &restart
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var restartErr error
	restarted := make(chan struct{})
	go func() {
		restartErr = cmd.Wait()
		close(restarted)
	}()
	t.Cleanup(func() {
		select {
		case <-restarted:
		default:
			cmd.Cancel() // the test failed before the job ended
			<-restarted
		}
	})
	before := len(readFile(t, log)) // earlier views admitted n2 too
	var admitted time.Duration
	waitFor(t, time.Minute, "the restarted worker to be admitted", func() bool {
		select {
		case <-restarted:
			t.Fatalf("the restart ended before it was admitted: %v\n%s", restartErr, restart.String())
		default:
		}
		if !strings.Contains(readFile(t, log)[before:], "admitted "+s.addr(2)+":7947") {
			return false
		}
		admitted = time.Since(killed)
		return true
	})
	state := s.waitJob(t, dir, id, 2*time.Minute)
	select {
	case <-restarted:
	case <-time.After(time.Minute):
		t.Fatalf("the restarted worker did not exit with its job:\n%s", restart.String())
	}
	out = readFile(t, log)
	if restartErr != nil || state != "COMPLETED" {
		t.Fatalf("job %s ended %s, the restarted worker %v:\n%s\n----\n%s", id, state, restartErr, out, restart.String())
	}
	if !strings.Contains(out, "srun: error: n2: task 1: ") || !strings.Contains(out, "the job finished; some of its workers were lost") {
		t.Errorf("job %s's output does not show the lost task and the finish:\n%s", id, out)
	}
	oneDigest(t, 3, iters, out, restart.String())
	t.Logf("kill -9 to the restarted worker's admission: %v; job %s COMPLETED, one digest on all 3 ranks", admitted.Round(time.Millisecond), id)
}
