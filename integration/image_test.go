package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
)

// TestContainerImage builds the project's Dockerfile with podman
// (deploy/image/testbed.sh makes its base images, as no registry is
// reachable here), then runs its image as docs/deploy.md has it: one
// container per host on 3 namespace hosts, each on its host's network,
// the same command with every host as a seed. They form one job of 3
// ranks that ends with one digest.
func TestContainerImage(t *testing.T) {
	t.Parallel() // beside the other deploy testbed: each has its own hosts and directory
	b := newTestbed(t, "the container image on namespace hosts", "deploy/image/testbed.sh", 6)
	const dir, tag = "/tmp/gyre-image-testbed", "localhost/gyre:test"
	t.Cleanup(func() {
		if out, err := b.command(t, "", time.Minute, "down").CombinedOutput(); err != nil {
			t.Errorf("testbed down: %v\n%s", err, out)
		}
		b.leftovers(t, dir, dir)
	})
	start := time.Now()
	build, err := b.command(t, "", 6*time.Minute, "build", tag).CombinedOutput()
	if err != nil {
		t.Fatalf("building the Dockerfile: %v\n%s", err, lastLines(string(build), 30))
	}
	var phases []string
	for _, line := range strings.Split(string(build), "\n") {
		if strings.HasPrefix(line, "testbed: ") {
			phases = append(phases, strings.TrimPrefix(line, "testbed: "))
		}
	}
	t.Logf("the Dockerfile's image built in %v in all (%s)", time.Since(start).Round(time.Millisecond), strings.Join(phases, "; "))
	out, err := b.command(t, "", time.Minute, "podman", "image", "inspect", "--format", "{{.Config.User}} {{.Config.Entrypoint}} {{.Size}}", tag).Output()
	if err != nil {
		t.Fatalf("image inspect: %v", err)
	}
	if f := strings.Fields(string(out)); len(f) != 3 || f[0] != "10001:10001" || f[1] != "[gyre]" {
		t.Errorf("the image runs %q; want user 10001:10001 and entry point [gyre]", out)
	}
	t.Logf("image: %s", strings.TrimSpace(string(out)))

	if out, err := b.command(t, "", time.Minute, "$CLUSTER_SH", "up", "3").CombinedOutput(); err != nil {
		t.Fatalf("cluster up: %v\n%s", err, out)
	}
	// The secret, readable by the image's user only, as the StatefulSet
	// mounts it.
	key := filepath.Join(t.TempDir(), "cluster.key")
	if out, err := exec.Command(gyretest.Gyre(t), "keygen", "--out", key).CombinedOutput(); err != nil {
		t.Fatalf("keygen: %v\n%s", err, out)
	}
	if err := os.Chown(key, 10001, 10001); err != nil {
		t.Fatal(err)
	}
	const iters = "300"
	var seeds []string
	for i := 1; i <= 3; i++ {
		seeds = append(seeds, b.addr(i)+":7946")
	}
	start = time.Now()
	outs := make([]string, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range outs {
		cmd := b.command(t, "", 2*time.Minute, "run", strconv.Itoa(i+1), "--rm", "-v", key+":/etc/gyre/cluster.key:ro", tag,
			"train", "--listen", seeds[i], "--seed", strings.Join(seeds, ","), "--key-file", "/etc/gyre/cluster.key",
			"--min-workers", "3", "--transport", "tcp", "--iters", iters)
		wg.Go(func() {
			out, err := cmd.CombinedOutput()
			outs[i], errs[i] = string(out), err
		})
	}
	wg.Wait() // each is killed after 2 minutes
	for i, err := range errs {
		if err != nil {
			t.Errorf("container on host %d: %v\n%s", i+1, err, outs[i])
		}
	}
	oneDigest(t, 3, iters, outs...)
	t.Logf("3 containers on 3 hosts: one job, one digest, in %v", time.Since(start).Round(time.Millisecond))
}
