package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
)

// TestSharedMemorySameDigests: 4 real processes on this machine train the
// same static job (equal shares, the ring always, in address order) over
// shared memory, over QUIC alone, and with shared memory on half of them,
// so that some links are shared memory and the others QUIC: the final
// state digests are bit-identical, since the path changes how bytes
// travel, never the order of the sums. Each worker's memory maps show
// rings where, and only where, its path is on.
func TestSharedMemorySameDigests(t *testing.T) {
	bin := gyretest.Gyre(t)
	const iters = "60"
	args := func(int) []string {
		return []string{bin, "--log-level", "warn", "train", "--iters", iters, "--target-acc", "0", "--eval-every", iters,
			"--balance", "static", "--algo", "ring", "--ring-order", "fixed"}
	}
	digests := map[string]string{}
	for _, job := range []struct {
		name string
		shm  func(rank int) string
	}{
		{"shared memory", func(int) string { return gyre.SharedMemoryAuto }},
		{"quic", func(int) string { return gyre.SharedMemoryOff }},
		{"mixed", func(r int) string { return []string{gyre.SharedMemoryAuto, gyre.SharedMemoryOff}[r%2] }},
	} {
		p := gyretest.StartProcs(t, gyretest.ProcOptions{N: 4, Gossip: true, Argv: args,
			Env: func(r int) []string { return []string{gyre.EnvSharedMemory + "=" + job.shm(r)} }})
		rings := make([]int, 4)
		stop, sampled := make(chan struct{}), make(chan struct{})
		go func() { // the most rings each worker mapped at once
			defer close(sampled)
			for {
				for r := range rings {
					rings[r] = max(rings[r], ringsOf(p.Pid(r)))
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		}()
		results := waitAll(t, p, 2*time.Minute)
		close(stop)
		<-sampled
		for r, n := range rings {
			if on := job.shm(r) == gyre.SharedMemoryAuto; on != (n > 0) {
				t.Errorf("%s: rank %d with --shm %s mapped up to %d rings", job.name, r, job.shm(r), n)
			}
		}
		var digest string
		for _, res := range results {
			m := digestLine.FindStringSubmatch(res.Stdout)
			if res.Code != 0 || m == nil || m[3] != iters {
				t.Fatalf("%s: rank %d exited %d; want 0 after iteration %s:\n%s\n%s", job.name, res.Rank, res.Code, iters, res.Stdout, res.Stderr)
			}
			if digest != "" && m[2] != digest {
				t.Fatalf("%s: rank %d ended with digest %s, rank 0 with %s", job.name, res.Rank, m[2], digest)
			}
			digest = m[2]
		}
		digests[job.name] = digest
	}
	if digests["quic"] != digests["shared memory"] || digests["mixed"] != digests["shared memory"] {
		t.Fatalf("digests differ by path: %v", digests)
	}
}

// ringsOf counts the shared-memory rings process pid maps, 0 once it has
// exited.
func ringsOf(pid int) int {
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		return 0
	}
	return strings.Count(string(maps), "memfd:gyre-ring")
}
