package gyre_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEveryLoopHandlesRedoAndLeft: every trainer loop a user may copy (the
// package documentation, README, the examples, gyre train's) handles
// Change.Redo and Change.Left after Boundary, as the package documentation
// says. One that does not goes on after RequestLeave and fails its next
// Commit with ErrClosed.
func TestEveryLoopHandlesRedoAndLeft(t *testing.T) {
	files := []string{"doc.go", "README.md", "internal/train/train.go"}
	examples, err := filepath.Glob("examples/*/main.go")
	if err != nil || len(examples) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, f := range append(files, examples...) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		if !strings.Contains(src, ".Boundary(ctx)") {
			t.Errorf("%s has no iteration loop calling Boundary", f)
			continue
		}
		// The checks themselves, after the Boundary call, not a mention.
		after := src[strings.Index(src, ".Boundary(ctx)"):]
		for _, want := range []string{"if change.Redo {", "if change.Left {"} {
			if !strings.Contains(after, want) {
				t.Errorf("%s's loop calls Boundary but has no %q after it", f, want)
			}
		}
	}
}
