package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// TestSecondWriterOfAFileIsRefused: two gyre train processes started by
// hand with one --metrics-file and one --timeline. The second fails at
// its start, naming the file and the process that holds it, and the
// first's files stay whole: every metrics line and the timeline parse.
func TestSecondWriterOfAFileIsRefused(t *testing.T) {
	gyre := gyretest.Gyre(t)
	dir := t.TempDir()
	metrics, timeline := filepath.Join(dir, "m.jsonl"), filepath.Join(dir, "t.json")
	args := []string{"train", "--iters", "1000000", "--target-acc", "0", "--metrics-file", metrics, "--timeline", timeline}
	first := exec.Command(gyre, args...)
	var out1, err1 transporttest.LogBuffer
	first.Stdout, first.Stderr = &out1, &err1
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Process.Kill() })
	for deadline := time.Now().Add(30 * time.Second); !strings.Contains(out1.String(), "%"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the first worker did not start training:\n%s\n%s", out1.String(), err1.String())
		}
	}
	for _, flag := range []string{"--metrics-file", "--timeline"} {
		// The other file is the second worker's own: only flag's is shared.
		second := []string{"train", "--iters", "10", "--metrics-file", filepath.Join(dir, "own.jsonl"), "--timeline", filepath.Join(dir, "own.json")}
		second = append(second, flag, map[string]string{"--metrics-file": metrics, "--timeline": timeline}[flag])
		cmd := exec.Command(gyre, second...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		want := fmt.Sprintf("is being written by another process (pid %d)", first.Process.Pid)
		if err == nil || !strings.Contains(stderr.String(), want) || !strings.Contains(stderr.String(), flag) {
			t.Fatalf("a second worker given the first's %s: %v\n%s\nwant an error naming %s and saying %q", flag, err, stderr.String(), flag, want)
		}
		t.Logf("%s", lastLine(stderr.String()))
	}
	// The first leaves at its next boundary, its files whole.
	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("the first worker: %v\n%s", err, err1.String())
	}
	f, err := os.Open(metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := 0
	for sc := bufio.NewScanner(f); sc.Scan(); lines++ {
		if !json.Valid(sc.Bytes()) {
			t.Fatalf("metrics line %d does not parse: %q", lines+1, sc.Text())
		}
	}
	if lines == 0 {
		t.Fatal("the first worker's metrics file is empty")
	}
	b, err := os.ReadFile(timeline)
	if err != nil || !json.Valid(b) {
		t.Fatalf("the timeline does not parse (%v)", err)
	}
}
