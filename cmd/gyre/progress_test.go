package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestLaunchProgressInTmux runs `gyre launch -n 2 -- train` in a tmux
// pane, a terminal, and finds the live progress line launch draws for
// rank 0 in capture-pane's output: the bar, the count, the loss,
// samples/s, the workers and their shares. Worker 0's plain progress
// lines must not show.
func TestLaunchProgressInTmux(t *testing.T) {
	progressInTmux(t, "launch -n 2 -- train --iters 4000 --target-acc 0 --eval-every 500",
		regexp.MustCompile(`\d+% \|.+\| \(\d+/4000, \d+ iter/s\).* loss \d+\.\d{4} · \d+ samples/s · 2 workers · shares \d+,\d+`))
}

// TestBenchProgressInTmux does the same for `gyre bench allreduce -n 2`:
// the line counts the timed allreduces of the sweep and names the size
// under way, and the table follows it.
func TestBenchProgressInTmux(t *testing.T) {
	progressInTmux(t, "bench allreduce -n 2 --sizes 4K,64K --iters 3000 --transport tcp --insecure",
		regexp.MustCompile(`\d+% \|.+\| \(\d+/6000, \d+ allreduce/s\).* size [12] of 2, (4|64)K: \d+/3000 · \d+ us · busbw \d+\.\d\d GB/s`))
}

// progressInTmux runs gyre ARGS in a tmux pane and waits for want in
// capture-pane's output.
func progressInTmux(t *testing.T, args string, want *regexp.Regexp) {
	tmux, err := exec.LookPath("tmux")
	if err != nil {
		t.Skip("tmux is not installed (.ci/run installs it: apt-get install tmux)")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A server of its own, so the test never touches the user's tmux.
	sock := filepath.Join(t.TempDir(), "tmux.sock")
	tm := func(args ...string) ([]byte, error) {
		return exec.Command(tmux, append([]string{"-S", sock}, args...)...).CombinedOutput()
	}
	line := fmt.Sprintf("env %s=1 %s %s; sleep 60", asCLI, exe, args)
	if out, err := tm("new-session", "-d", "-s", "progress", "-x", "200", "-y", "30", line); err != nil {
		t.Fatalf("tmux new-session: %v\n%s", err, out)
	}
	defer tm("kill-server")
	var screen string
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, err := tm("capture-pane", "-p", "-t", "progress")
		if err != nil {
			t.Fatalf("tmux capture-pane: %v\n%s\nthe last screen:\n%s", err, out, screen)
		}
		screen = string(out)
		if want.MatchString(screen) {
			break
		}
	}
	t.Logf("capture-pane:\n%s", screen)
	if !want.MatchString(screen) {
		t.Fatalf("no progress line in the pane")
	}
	if strings.Contains(screen, "#gyre-progress") {
		t.Fatalf("worker 0's plain progress lines reached the terminal")
	}
}
