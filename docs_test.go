package gyre_test

import (
	"bytes"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// The repository must stand on its own: whoever clones it gets no design
// notes and no neighbouring directories. So no file cites the design
// notes, and only .ci/run, the one file that knows this machine, names
// the shared directory where the namespace-cluster script and the
// reference peers live here; everything else calls them $CLUSTER_SH and
// $PEERS (README, "Benchmark clusters"). Outputs recorded under
// bench/results/ keep the commands as they were run.
//
// The needles are split so that this file does not match itself.
var (
	designNotes = "DESIGN" + ".md"
	sharedDir   = ".." + "/shared"
)

func TestDocsStandAlone(t *testing.T) {
	files := repoFiles(t)
	for _, f := range files {
		if strings.HasPrefix(f, "bench/results/") {
			continue
		}
		b, err := os.ReadFile(f)
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range bytes.Split(b, []byte("\n")) {
			if bytes.Contains(line, []byte(designNotes)) {
				t.Errorf("%s:%d cites %s, which a clone does not have; point at docs/architecture.md instead", f, i+1, designNotes)
			}
			if f != ".ci/run" && bytes.Contains(line, []byte(sharedDir)) {
				t.Errorf("%s:%d names %s, which a clone does not have; write $CLUSTER_SH or $PEERS (README explains them)", f, i+1, sharedDir)
			}
		}
	}
}

// repoFiles lists the repository's files, tracked and new but not
// ignored, relative to its root (this package's directory).
func repoFiles(t *testing.T) []string {
	t.Helper()
	if _, err := os.Stat(".git"); err != nil {
		t.Skip("not a git checkout: nothing to list the repository's files with")
	}
	out, err := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard").Output()
	if err != nil {
		t.Fatalf("git ls-files: %v", err)
	}
	files := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if len(files) == 0 || files[0] == "" {
		t.Fatal("git ls-files listed no files")
	}
	return files
}
