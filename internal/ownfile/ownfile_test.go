package ownfile

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestHelperProcess holds OWNFILE_PATH until its stdin closes: another
// process, since this process's own locks never conflict.
func TestHelperProcess(t *testing.T) {
	path := os.Getenv("OWNFILE_PATH")
	if path == "" {
		t.Skip("a helper for TestSecondProcessIsRefused")
	}
	f, err := Create(path)
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	fmt.Fprintln(f, "held")
	fmt.Println("held")
	buf := make([]byte, 1)
	os.Stdin.Read(buf)
	os.Exit(0)
}

// TestSecondProcessIsRefused: while one process holds a file, Create and
// Open in another fail with a HeldError naming its pid, and the file is
// left as the holder wrote it; once the holder exits, the file is free.
func TestSecondProcessIsRefused(t *testing.T) {
	path := filepath.Join(t.TempDir(), "metrics.jsonl")
	holder := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	holder.Env = append(os.Environ(), "OWNFILE_PATH="+path)
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	line := make([]byte, 64)
	n, _ := out.Read(line)
	if got := strings.TrimSpace(string(line[:n])); got != "held" {
		t.Fatalf("the holder said %q", got)
	}
	for name, open := range map[string]func(string) (*os.File, error){"Create": Create, "Open": Open} {
		f, err := open(path)
		var held *HeldError
		if !errors.As(err, &held) || held.PID != holder.Process.Pid || held.Path != path {
			if f != nil {
				f.Close()
			}
			t.Fatalf("%s of a held file = %v, want a HeldError naming pid %d", name, err, holder.Process.Pid)
		}
		if want := fmt.Sprintf("%s is being written by another process (pid %d)", path, holder.Process.Pid); !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: error %q, want it to say %q", name, err, want)
		}
	}
	if b, _ := os.ReadFile(path); string(b) != "held\n" {
		t.Fatalf("the refused opens changed the file to %q", b)
	}
	stdin.Close()
	holder.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		f, err := Create(path)
		if err == nil {
			f.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the file is still held after its holder exited: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b, _ := os.ReadFile(path); len(b) != 0 {
		t.Fatalf("Create did not truncate: %q", b)
	}
}

// TestOpenKeepsTheFile: Open takes the file without truncating it.
func TestOpenKeepsTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "params")
	if err := os.WriteFile(path, []byte("earlier"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if b, _ := os.ReadFile(path); string(b) != "earlier" {
		t.Fatalf("Open changed the file to %q", b)
	}
	if _, err := Open(filepath.Join(t.TempDir(), "no", "such", "dir")); err == nil {
		t.Fatal("Open of a path in a missing directory succeeded")
	}
}

// TestDevicesAreNotLocked: a path that is not a regular file opens as it
// is, however many processes write it.
func TestDevicesAreNotLocked(t *testing.T) {
	for _, open := range []func(string) (*os.File, error){Create, Open} {
		f, err := open(os.DevNull)
		if err != nil {
			t.Fatalf("%s: %v", os.DevNull, err)
		}
		f.Close()
	}
	if Regular(os.DevNull) || !Regular(filepath.Join(t.TempDir(), "new")) {
		t.Fatal("Regular: /dev/null is not a regular file, and a new path would be")
	}
}
