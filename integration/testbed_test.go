package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// clusterScripts checks what the deploy testbeds need: GYRE_CLUSTER_TESTS,
// root and $CLUSTER_SH. It returns the absolute path of the testbed script
// rel (from the repository's root) and an environment for it.
func clusterScripts(t *testing.T, what, rel string) (script string, env []string) {
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
	return script, os.Environ()
}

// leftovers fails t if anything of a testbed survived its teardown: a
// process whose command line holds one of procs, a namespace named with
// prefix, a mount under dir, or dir itself.
func leftovers(t *testing.T, dir, prefix string, procs ...string) {
	t.Helper()
	for _, p := range procs {
		if out, err := exec.Command("pgrep", "-a", "-f", p).Output(); err == nil {
			t.Errorf("processes of the testbed survived it:\n%s", out)
		}
	}
	if out, _ := exec.Command("ip", "netns", "list").Output(); strings.Contains(string(out), prefix) {
		t.Errorf("namespaces of the testbed survived it:\n%s", out)
	}
	if mounts, _ := os.ReadFile("/proc/self/mounts"); strings.Contains(string(mounts), dir) {
		t.Errorf("mounts under %s survived the testbed", dir)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("%s survived the testbed", dir)
	}
}
