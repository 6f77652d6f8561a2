package archtest

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gyre-ml/gyre"

// The layers (docs/architecture.md, "Import rules").
var (
	// engine is imported by the root package only.
	engine = module + "/internal/engine"
	// consumers may import the root package: the CLI, the benchmarks,
	// the test harness, the examples and the training job; and tests of
	// the root package and the black-box integration tests.
	consumers = []string{module + "/cmd/...", module + "/internal/bench/...", module + "/gyretest", module + "/examples/...",
		module + "/internal/train"}
	testConsumers = []string{module, module + "/integration"}
	// pure packages, and the pure files of ring: no goroutines, no I/O,
	// no clock. They import only each other, leaves and the standard
	// library's pure packages.
	purePackages = []string{module + "/internal/vote", module + "/internal/recovery", module + "/internal/merge", module + "/balance",
		module + "/internal/state", module + "/internal/sampler"}
	// leaves are imported by pure packages, and are held to the same rules.
	leaves   = []string{module + "/transport", module + "/internal/wire", module + "/internal/errs"}
	pureRing = []string{"plan.go", "doubling.go", "order.go", "choose.go"}
	// pureThirdParty are numeric libraries pure code may use.
	pureThirdParty = []string{"gonum.org/v1/gonum/..."}
	// impureStd are standard packages that do I/O, or whose use in pure
	// code would mean it does.
	impureStd = []string{"net", "net/http/...", "net/rpc/...", "net/smtp", "net/mail", "net/url", "os/...", "os",
		"syscall", "io/ioutil", "io/fs", "log", "log/...", "runtime/pprof", "crypto/rand", "math/rand"}
	// clock lists the time functions that read the clock or wait.
	clock = []string{"Now", "Since", "Until", "Sleep", "After", "AfterFunc", "NewTimer", "NewTicker", "Tick"}
)

// pkg is one package of the module, as its source says.
type pkg struct {
	path  string
	files []srcFile // non-test files
	// imports and testImports are the packages its files and its test
	// files import.
	imports, testImports []string
}

// srcFile is one parsed file, with the file set that places its nodes.
type srcFile struct {
	fset *token.FileSet
	f    *ast.File
}

// load parses every package of the module rooted at root (skipping
// nested modules and testdata).
func load(t testing.TB, root string) map[string]*pkg {
	t.Helper()
	fset := token.NewFileSet()
	pkgs := map[string]*pkg{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if p != root && (name == "testdata" || strings.HasPrefix(name, ".") || exists(filepath.Join(p, "go.mod"))) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		ip := module
		if rel != "." {
			ip = module + "/" + filepath.ToSlash(rel)
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		k := pkgs[ip]
		if k == nil {
			k = &pkg{path: ip}
			pkgs[ip] = k
		}
		var imps []string
		for _, is := range f.Imports {
			s, _ := strconv.Unquote(is.Path.Value)
			imps = append(imps, s)
		}
		if strings.HasSuffix(p, "_test.go") {
			k.testImports = append(k.testImports, imps...)
		} else {
			k.imports = append(k.imports, imps...)
			k.files = append(k.files, srcFile{fset, f})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

// matches reports whether ip is one of patterns, where "x/..." matches x
// and everything below it.
func matches(ip string, patterns []string) bool {
	for _, p := range patterns {
		if base, ok := strings.CutSuffix(p, "/..."); ok {
			if ip == base || strings.HasPrefix(ip, base+"/") {
				return true
			}
		} else if ip == p {
			return true
		}
	}
	return false
}

// importRules returns every import that breaks the layering.
func importRules(pkgs map[string]*pkg) []string {
	var bad []string
	for _, k := range sorted(pkgs) {
		for _, ip := range k.imports {
			switch {
			case ip == engine && k.path != module:
				bad = append(bad, fmt.Sprintf("%s imports the engine: only the root package does", k.path))
			case ip == module && !matches(k.path, consumers):
				bad = append(bad, fmt.Sprintf("%s imports the root package: only consumers do (cmd, internal/bench/..., gyretest, examples, internal/train)", k.path))
			}
		}
		for _, ip := range k.testImports {
			switch {
			case ip == engine && k.path != module && k.path != engine:
				bad = append(bad, fmt.Sprintf("%s's tests import the engine", k.path))
			case ip == module && !matches(k.path, consumers) && !matches(k.path, testConsumers):
				bad = append(bad, fmt.Sprintf("%s's tests import the root package, which only consumers and integration tests do", k.path))
			}
		}
	}
	return bad
}

// pureRules returns every breach of purity in the pure packages, the
// leaves and ring's plans.
func pureRules(pkgs map[string]*pkg) []string {
	var bad []string
	for _, k := range sorted(pkgs) {
		pure := matches(k.path, purePackages) || matches(k.path, leaves)
		files := k.files
		if k.path == module+"/ring" {
			pure, files = true, nil
			for _, f := range k.files {
				if slices.Contains(pureRing, filepath.Base(f.fset.File(f.f.Pos()).Name())) {
					files = append(files, f)
				}
			}
		}
		if !pure {
			continue
		}
		for _, f := range files {
			bad = append(bad, pureFile(k.path, f)...)
		}
	}
	return bad
}

// pureFile returns the breaches of purity in sf, of package ip.
func pureFile(ip string, sf srcFile) []string {
	var bad []string
	where := func(n ast.Node) string {
		p := sf.fset.Position(n.Pos())
		return fmt.Sprintf("%s:%d (%s)", filepath.Base(p.Filename), p.Line, ip)
	}
	timeName := ""
	for _, is := range sf.f.Imports {
		s, _ := strconv.Unquote(is.Path.Value)
		switch {
		case strings.HasPrefix(s, module) && !matches(s, purePackages) && !matches(s, leaves):
			bad = append(bad, fmt.Sprintf("%s imports %s, which is not pure", where(is), s))
		case !strings.HasPrefix(s, module) && strings.Contains(strings.SplitN(s, "/", 2)[0], ".") && !matches(s, pureThirdParty):
			bad = append(bad, fmt.Sprintf("%s imports %s, a third-party package pure code may not use", where(is), s))
		case matches(s, impureStd):
			bad = append(bad, fmt.Sprintf("%s imports %s, which does I/O", where(is), s))
		case s == "time":
			timeName = "time"
			if is.Name != nil {
				timeName = is.Name.Name
			}
		}
	}
	ast.Inspect(sf.f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			bad = append(bad, fmt.Sprintf("%s starts a goroutine", where(n)))
		case *ast.SelectorExpr:
			if id, ok := n.X.(*ast.Ident); ok && timeName != "" && id.Name == timeName && slices.Contains(clock, n.Sel.Name) {
				bad = append(bad, fmt.Sprintf("%s calls time.%s: pure code does not read the clock or wait", where(n), n.Sel.Name))
			}
		}
		return true
	})
	return bad
}

func sorted(pkgs map[string]*pkg) []*pkg {
	var out []*pkg
	for _, k := range pkgs {
		out = append(out, k)
	}
	slices.SortFunc(out, func(a, b *pkg) int { return strings.Compare(a.path, b.path) })
	return out
}

// moduleRoot is the directory of the module's go.mod, above this test's.
func moduleRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for !exists(filepath.Join(dir, "go.mod")) {
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
	return dir
}

// TestImportRules: the engine is imported by the root package only, and
// the root package by its consumers only; so no mechanism package
// imports either.
func TestImportRules(t *testing.T) {
	for _, b := range importRules(load(t, moduleRoot(t))) {
		t.Error(b)
	}
}

// TestPurePackages: the pure packages, their leaves and ring's plans
// start no goroutine, import nothing that does I/O, and neither read the
// clock nor wait.
func TestPurePackages(t *testing.T) {
	pkgs := load(t, moduleRoot(t))
	for _, ip := range append(slices.Clone(purePackages), append(leaves, module+"/ring")...) {
		if pkgs[ip] == nil || len(pkgs[ip].files) == 0 {
			t.Errorf("%s: no source found; the rules would check nothing", ip)
		}
	}
	for _, b := range pureRules(pkgs) {
		t.Error(b)
	}
}

// TestRulesCatchViolations: a module that breaks each rule once is caught
// once for each, so the two tests above can fail.
func TestRulesCatchViolations(t *testing.T) {
	root := t.TempDir()
	write := func(name, src string) {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module "+module+"\n")
	write("gyre.go", "package gyre\nimport _ \""+engine+"\"\n")
	write("internal/engine/engine.go", "package engine\n")
	write("internal/view/view.go", "package view\nimport _ \""+engine+"\"\nimport _ \""+module+"\"\n")
	write("cmd/gyre/main.go", "package main\nimport _ \""+module+"\"\n")
	write("internal/vote/vote.go", `package vote
import (
	"net"
	"time"
	_ "`+module+`/internal/view"
)
func f() { go func() {}(); time.Sleep(time.Now().Sub(time.Time{})); _ = net.IPv4len }
`)
	write("ring/plan.go", "package ring\nimport \"os\"\nvar _ = os.Args\n")
	write("ring/exec.go", "package ring\nfunc g() { go g() }\n")
	pkgs := load(t, root)
	imports := importRules(pkgs)
	if len(imports) != 2 || !strings.Contains(imports[0], "view imports the engine") ||
		!strings.Contains(imports[1], "view imports the root package") {
		t.Errorf("import rules found %q; want the view's import of the engine and of the root package", imports)
	}
	pure := pureRules(pkgs)
	want := []string{"plan.go:2 (" + module + "/ring) imports os", "vote.go:3 (" + module + "/internal/vote) imports net",
		"imports " + module + "/internal/view, which is not pure", "vote.go:7", "starts a goroutine", "time.Sleep", "time.Now"}
	for _, w := range want {
		if !slices.ContainsFunc(pure, func(s string) bool { return strings.Contains(s, w) }) {
			t.Errorf("purity rules missed %q; found %q", w, pure)
		}
	}
	if len(pure) != len(want)-1 {
		t.Errorf("purity rules found %d breaches, want %d (exec.go is not one of ring's plans): %q", len(pure), len(want)-1, pure)
	}
}
