package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// testbed is a deploy testbed script (deploy/*/testbed.sh) and the
// environment it runs in: $CLUSTER_SH, and the namespace hosts'
// CLUSTER_ID, so that the hosts' addresses are 10.77.ID.I.
type testbed struct {
	script string
	id     int
	env    []string
}

// newTestbed checks what the deploy testbeds need: GYRE_CLUSTER_TESTS,
// root and $CLUSTER_SH. rel is the script's path from the repository's
// root; id is the CLUSTER_ID its hosts use.
func newTestbed(t *testing.T, what, rel string, id int) *testbed {
	t.Helper()
	if os.Getenv("GYRE_CLUSTER_TESTS") != "1" {
		t.Skipf("%s: runs in the GYRE_CLUSTER_TESTS step of CI (GYRE_CLUSTER_TESTS=1, root, $CLUSTER_SH, and what `%s deps` installs)", what, rel)
	}
	sh := os.Getenv("CLUSTER_SH")
	if _, err := os.Stat(sh); err != nil || os.Geteuid() != 0 {
		t.Fatalf("GYRE_CLUSTER_TESTS=1 needs root and CLUSTER_SH naming the cluster script (README); CLUSTER_SH=%q: %v", sh, err)
	}
	script, err := filepath.Abs(filepath.Join("..", rel))
	if err != nil {
		t.Fatal(err)
	}
	return &testbed{script: script, id: id, env: append(os.Environ(), "CLUSTER_ID="+strconv.Itoa(id))}
}

// addr is host i's address.
func (b *testbed) addr(i int) string { return "10.77." + strconv.Itoa(b.id) + "." + strconv.Itoa(i) }

// command runs the testbed script (or, with args[0] "$CLUSTER_SH", the
// cluster script) with args in dir. It is killed, with every process
// of its group, after limit.
func (b *testbed) command(t *testing.T, dir string, limit time.Duration, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	t.Cleanup(cancel)
	name := b.script
	if len(args) > 0 && args[0] == "$CLUSTER_SH" {
		name, args = os.Getenv("CLUSTER_SH"), args[1:]
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir, cmd.Env = dir, b.env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second // for daemons holding its output
	return cmd
}

// leftovers fails t if anything of a testbed survived its teardown: a
// process whose command line holds one of procs, a namespace of its
// hosts, a mount under dir, or dir itself.
func (b *testbed) leftovers(t *testing.T, dir string, procs ...string) {
	t.Helper()
	for _, p := range procs {
		if out, err := exec.Command("pgrep", "-a", "-f", p).Output(); err == nil {
			t.Errorf("processes of the testbed survived it:\n%s", out)
		}
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), "gy"+strconv.Itoa(b.id)+"h") {
		t.Errorf("namespaces of the testbed survived it:\n%s", out)
	}
	if mounts, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(mounts), dir) {
		t.Errorf("mounts under %s survived the testbed", dir)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("%s survived the testbed", dir)
	}
}
