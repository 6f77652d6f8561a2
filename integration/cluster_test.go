package integration

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// The recovery scenarios on separate hosts: network namespaces built by
// the cluster script ($CLUSTER_SH, README "Benchmark clusters"), one
// gyre train per host, over QUIC. They need root, and run with
// GYRE_CLUSTER_TESTS=1, one at a time (the script's hosts are shared).

// nsJob is one gyre train process per namespace host.
type nsJob struct {
	sh, gyre, key string
	procs         []*nsProc // by host, from host 1
	earlier       []*nsProc // processes a restart replaced
}

type nsProc struct {
	host     int
	cmd      *exec.Cmd
	out, err transporttest.LogBuffer
	done     chan struct{}
	code     int
}

func (j *nsJob) cluster(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(j.sh, args...).CombinedOutput(); err != nil {
		t.Fatalf("cluster %v: %v\n%s", args, err, out)
	}
}

func (j *nsJob) addr(t *testing.T, i int) string {
	t.Helper()
	out, err := exec.Command(j.sh, "addr", strconv.Itoa(i)).Output()
	if err != nil {
		t.Fatalf("cluster addr %d: %v", i, err)
	}
	return strings.TrimSpace(string(out))
}

// upNS brings up n namespace hosts and a cluster secret for them, and
// takes them down when the test ends.
func upNS(t *testing.T, n int) *nsJob {
	t.Helper()
	if os.Getenv("GYRE_CLUSTER_TESTS") != "1" {
		t.Skip("namespace-host scenario: runs in the GYRE_CLUSTER_TESTS step of CI (GYRE_CLUSTER_TESTS=1, root, $CLUSTER_SH)")
	}
	sh := os.Getenv("CLUSTER_SH")
	if _, err := os.Stat(sh); err != nil || os.Geteuid() != 0 {
		t.Fatalf("GYRE_CLUSTER_TESTS=1 needs root and CLUSTER_SH naming the cluster script (README); CLUSTER_SH=%q: %v", sh, err)
	}
	j := &nsJob{sh: sh, gyre: gyretest.Gyre(t)}
	for _, tool := range []string{"tc", "iptables"} {
		if _, err := exec.LookPath(tool); err != nil {
			j.cluster(t, "deps") // iproute2 and iptables
			break
		}
	}
	j.cluster(t, "up", strconv.Itoa(n))
	t.Cleanup(func() {
		exec.Command(sh, "down").Run()
		if t.Failed() {
			for _, p := range j.earlier {
				t.Logf("host %d before its restart:\n%s\n%s", p.host, lastLines(p.out.String(), 8), p.err.String())
			}
			for _, p := range j.procs {
				if p == nil {
					continue
				}
				t.Logf("host %d:\n%s\n%s", p.host, lastLines(p.out.String(), 8), p.err.String())
			}
		}
	})
	j.key = filepath.Join(t.TempDir(), "cluster.key")
	if out, err := exec.Command(j.gyre, "keygen", "--out", j.key).CombinedOutput(); err != nil {
		t.Fatalf("keygen: %v\n%s", err, out)
	}
	return j
}

// start runs gyre with args on host i (1-based) as the job's process i;
// starting host i again replaces its process (kept for the logs).
func (j *nsJob) start(t *testing.T, i int, args ...string) *nsProc {
	t.Helper()
	p := &nsProc{host: i, cmd: exec.Command(j.sh, append([]string{"run", strconv.Itoa(i), j.gyre}, args...)...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.err
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	for len(j.procs) < i {
		j.procs = append(j.procs, nil)
	}
	if old := j.procs[i-1]; old != nil {
		j.earlier = append(j.earlier, old)
	}
	j.procs[i-1] = p
	return p
}

// startNSJob brings up n hosts and starts a gossip job of gyre train on
// them, host 1 the seed, with the given extra flags.
func startNSJob(t *testing.T, n int, iters int) *nsJob {
	t.Helper()
	j := upNS(t, n)
	seed := j.addr(t, 1) + ":7946"
	for i := 1; i <= n; i++ {
		a := j.addr(t, i)
		args := []string{"--log-level", workerLogLevel(), "train", "--listen", a + ":7946",
			"--data-addr", a + ":7947", "--key-file", j.key, "--gossip-timing", "local", "--iters", strconv.Itoa(iters),
			"--eval-every", "100", "--target-acc", "0", "--peer-timeout", "1s", "--quorum-timeout", "20s",
			"--join-timeout", "40s", "--log-positions", "--transport", nsTransport()}
		if i == 1 {
			args = append(args, "--min-workers", strconv.Itoa(n))
		} else {
			args = append(args, "--seed", seed)
		}
		j.start(t, i, args...)
	}
	for deadline := time.Now().Add(60 * time.Second); !progress.MatchString(j.procs[0].out.String()); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("host 1 printed no progress row within 60 s:\n%s\n%s", j.procs[0].out.String(), j.procs[0].err.String())
		}
	}
	return j
}

// wait waits for host i's process (1-based) for up to limit.
func (j *nsJob) wait(t *testing.T, i int, limit time.Duration) (code int, ok bool) {
	t.Helper()
	select {
	case <-j.procs[i-1].done:
		return j.procs[i-1].code, true
	case <-time.After(limit):
		return 0, false
	}
}

// finished checks that hosts finished with one digest at one iteration:
// iters, or any if iters is negative (a job that stops at a target).
func (j *nsJob) finished(t *testing.T, iters int, hosts ...int) {
	t.Helper()
	digests := map[string][]int{}
	for _, i := range hosts {
		code, ok := j.wait(t, i, 3*time.Minute)
		out := j.procs[i-1].out.String()
		m := digestLine.FindStringSubmatch(out)
		if !ok || code != 0 || m == nil || iters >= 0 && m[3] != strconv.Itoa(iters) {
			t.Errorf("host %d: exited %v (%d); want 0 after iteration %d:\n%s\n%s", i, ok, code, iters, lastLines(out, 5), j.procs[i-1].err.String())
			continue
		}
		digests[m[2]+" at iteration "+m[3]] = append(digests[m[2]+" at iteration "+m[3]], i)
	}
	if len(digests) != 1 {
		t.Errorf("hosts %v ended with %d digests: %v", hosts, len(digests), digests)
	}
}

// TestClusterRecovery: on separate hosts, a cut link is a crash; one
// pair that cannot talk leaves a majority view that all its members agree
// on; a 3+1 partition lets the 3 go on while the 1 waits, and the 1
// rejoins after the heal; a 2+2 partition stops both halves, and after a
// heal within --quorum-timeout all 4 go on from the newest commit.
func TestClusterRecovery(t *testing.T) {
	const iters = 1500
	t.Run("cut", func(t *testing.T) {
		j := startNSJob(t, 4, iters)
		j.cluster(t, "cut", "3")
		j.finished(t, iters, 1, 2, 4)
		if code, ok := j.wait(t, 3, 60*time.Second); !ok || code != 75 {
			t.Errorf("the cut host: exited %v (%d), want status 75 (no quorum) after --quorum-timeout", ok, code)
		}
	})
	t.Run("pair", func(t *testing.T) {
		// Hosts 1 and 4 cannot talk; the others reach both. The view that
		// goes on keeps 2 and 3 and one of the pair, whichever reached
		// more of the others when the coordinator decided, and every
		// member of it names the other one lost.
		j := startNSJob(t, 4, iters)
		j.cluster(t, "partition", "1", "4")
		kept, dropped := 1, 4
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if strings.Contains(j.procs[1].err.String(), "recovered") {
				break
			}
		}
		if strings.Contains(j.procs[1].err.String(), fmt.Sprintf(`"lost":["%s:7947"]`, j.addr(t, 1))) {
			kept, dropped = 4, 1
		}
		j.finished(t, iters, 2, 3, kept)
		for _, i := range []int{2, 3, kept} {
			if !strings.Contains(j.procs[i-1].err.String(), fmt.Sprintf(`"lost":["%s:7947"]`, j.addr(t, dropped))) {
				t.Errorf("host %d did not recover without host %d, as host 2 did:\n%s", i, dropped, j.procs[i-1].err.String())
			}
		}
	})
	t.Run("3+1", func(t *testing.T) {
		// The job must outlast host 4's rejoin: at 1500 iterations the
		// 3 could finish 2 s after it went back to pending.
		const iters = 5000
		j := startNSJob(t, 4, iters)
		cut := time.Now()
		for _, i := range []string{"1", "2", "3"} {
			j.cluster(t, "partition", i, "4")
		}
		// Long enough for the 3 to recover without host 4 and for gossip
		// on both sides to hold the other dead, short of --quorum-timeout
		// (20 s, counted from host 4's failure). GYRE_PARTITION sets
		// another.
		hold := 10 * time.Second
		if d, err := time.ParseDuration(os.Getenv("GYRE_PARTITION")); err == nil {
			hold = d
		}
		time.Sleep(hold)
		for _, i := range []string{"1", "2", "3"} {
			j.cluster(t, "heal", i, "4")
		}
		healed := time.Now()
		for time.Since(healed) < time.Minute {
			if strings.Contains(j.procs[3].err.String(), "rejoining as a new member") {
				t.Logf("host 4 learnt it was left out %v after the heal, %v after the partition began (held %v)",
					time.Since(healed).Round(10*time.Millisecond), healed.Sub(cut).Round(10*time.Millisecond), hold)
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		j.finished(t, iters, 1, 2, 3, 4)
		if !strings.Contains(j.procs[3].err.String(), "rejoining as a new member") {
			t.Errorf("host 4 did not rejoin:\n%s", j.procs[3].err.String())
		}
	})
	t.Run("2+2", func(t *testing.T) {
		j := startNSJob(t, 4, iters)
		pairs := [][2]string{{"1", "3"}, {"1", "4"}, {"2", "3"}, {"2", "4"}}
		for _, p := range pairs {
			j.cluster(t, "partition", p[0], p[1])
		}
		time.Sleep(5 * time.Second) // both halves stop: neither holds a majority
		for _, i := range []int{1, 2, 3, 4} {
			if !strings.Contains(j.procs[i-1].err.String(), "recovering") {
				t.Errorf("host %d did not stop to recover during the partition", i)
			}
		}
		for _, p := range pairs {
			j.cluster(t, "heal", p[0], p[1])
		}
		j.finished(t, iters, 1, 2, 3, 4)
	})
}

// workerLogLevel is the workers' log level: GYRE_TEST_LOG_LEVEL, to see a
// scenario's recovery messages, or warn.
func workerLogLevel() string {
	if l := os.Getenv("GYRE_TEST_LOG_LEVEL"); l != "" {
		return l
	}
	return "warn"
}

// nsTransport is the workers' transport: GYRE_TEST_TRANSPORT, or quic.
func nsTransport() string {
	if tr := os.Getenv("GYRE_TEST_TRANSPORT"); tr != "" {
		return tr
	}
	return "quic"
}
