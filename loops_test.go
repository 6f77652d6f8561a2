package gyre_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The trainer loop has one source: the package example (Example in
// example_test.go), which go test runs. README holds a copy of it, checked
// here line for line; the loops of the examples and of gyre train are
// trainers of their own, checked here to follow the example's steps in
// its order: Batch, AllReduceAsync, Wait, Boundary, reading Change.Redo
// and Change.Left, Commit; and after the loop, Leave. Two mistakes a loop
// written from older docs makes fail them: treating a failed Wait as
// fatal, and skipping Commit after a Redo.

// steps is what a loop does, in source order: the calls on the worker
// that make up an iteration, and the fields of the Change it reads.
var loopSteps = []string{"Batch", "AllReduceAsync", "Wait", "Boundary", "Redo", "Left", "Commit"}

// loopOf finds, in f, the loop that calls Boundary, and the statements
// that follow it in its block.
func loopOf(f *ast.File) (loop *ast.ForStmt, after []ast.Stmt) {
	ast.Inspect(f, func(n ast.Node) bool {
		b, ok := n.(*ast.BlockStmt)
		if !ok || loop != nil {
			return loop == nil
		}
		for i, st := range b.List {
			if fs, ok := st.(*ast.ForStmt); ok && calls(fs, "Boundary") {
				loop, after = fs, b.List[i+1:]
				return false
			}
		}
		return true
	})
	return loop, after
}

// calls reports whether n calls a method named name.
func calls(n ast.Node, name string) bool {
	found := false
	ast.Inspect(n, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == name {
				found = true
			}
		}
		return !found
	})
	return found
}

// stepsOf lists the steps of loop in source order, each at its first
// position.
func stepsOf(loop *ast.ForStmt) []string {
	var out []string
	add := func(s string) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	ast.Inspect(loop.Body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if s, ok := n.Fun.(*ast.SelectorExpr); ok {
				name := strings.TrimSuffix(s.Sel.Name, "64")
				if slices.Contains(loopSteps, name) {
					add(name)
				}
			}
		case *ast.SelectorExpr:
			if n.Sel.Name == "Redo" || n.Sel.Name == "Left" {
				add(n.Sel.Name)
			}
		}
		return true
	})
	return out
}

// fatalWait reports an if-statement that ends the loop on any error of
// Wait: its condition is just err != nil, and its body returns, exits or
// panics.
func fatalWait(loop *ast.ForStmt) bool {
	fatal := false
	ast.Inspect(loop.Body, func(n ast.Node) bool {
		is, ok := n.(*ast.IfStmt)
		if !ok || is.Init == nil || !calls(is.Init, "Wait") {
			return true
		}
		if be, ok := is.Cond.(*ast.BinaryExpr); ok && be.Op == token.NEQ {
			if id, ok := be.Y.(*ast.Ident); ok && id.Name == "nil" && exits(is.Body) {
				fatal = true
			}
		}
		return true
	})
	return fatal
}

// exits reports whether b returns or ends the process.
func exits(b *ast.BlockStmt) bool {
	for _, st := range b.List {
		switch st := st.(type) {
		case *ast.ReturnStmt:
			return true
		case *ast.ExprStmt:
			if c, ok := st.X.(*ast.CallExpr); ok {
				if s, ok := c.Fun.(*ast.SelectorExpr); ok && (strings.HasPrefix(s.Sel.Name, "Fatal") || s.Sel.Name == "Exit") {
					return true
				}
				if id, ok := c.Fun.(*ast.Ident); ok && id.Name == "panic" {
					return true
				}
			}
		}
	}
	return false
}

// skipsCommit reports a continue, return or break, under a condition
// that reads Redo, before the loop's Commit: the iteration a recovery
// adopted would not be committed.
func skipsCommit(fset *token.FileSet, loop *ast.ForStmt) bool {
	commit := token.NoPos
	ast.Inspect(loop.Body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok && commit == token.NoPos {
			if s, ok := c.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "Commit" {
				commit = c.Pos()
			}
		}
		return true
	})
	skips := false
	ast.Inspect(loop.Body, func(n ast.Node) bool {
		is, ok := n.(*ast.IfStmt)
		if !ok || is.Pos() > commit || !reads(is.Cond, "Redo") {
			return true
		}
		for _, st := range is.Body.List {
			switch st := st.(type) {
			case *ast.BranchStmt:
				skips = skips || st.Tok == token.CONTINUE || st.Tok == token.BREAK
			case *ast.ReturnStmt:
				skips = true
			}
		}
		return true
	})
	return skips
}

// reads reports whether e reads a field named name.
func reads(e ast.Expr, name string) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok && s.Sel.Name == name {
			found = true
		}
		return !found
	})
	return found
}

// parseLoop parses a Go file, or a README's block of statements wrapped
// in a function, and returns its loop.
func parseLoop(t *testing.T, name, src string) (*token.FileSet, *ast.ForStmt, []ast.Stmt) {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, 0)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	loop, after := loopOf(f)
	if loop == nil {
		t.Fatalf("%s has no loop that calls Boundary", name)
	}
	return fset, loop, after
}

// exampleLoop is the source: Example's body, from Join on.
func exampleLoop(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	src := string(b)
	start := strings.Index(src, "\nfunc Example() {\n")
	if start < 0 {
		t.Fatal("example_test.go has no func Example")
	}
	body := src[start:]
	body = body[:strings.Index(body, "\t// Output:")]
	body = body[strings.Index(body, "\tw, err := gyre.Join("):]
	var lines []string
	for _, l := range strings.Split(strings.TrimRight(body, "\n\t "), "\n") {
		lines = append(lines, strings.TrimPrefix(l, "\t"))
	}
	return strings.Join(lines, "\n")
}

// TestReadmeLoopIsTheExample: README's loop is the package example's,
// line for line.
func TestReadmeLoopIsTheExample(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	want := exampleLoop(t)
	blocks := regexp.MustCompile("(?s)```go\n(.*?)\n```").FindAllStringSubmatch(string(readme), -1)
	for _, b := range blocks {
		if strings.Contains(b[1], ".Boundary(ctx)") {
			if b[1] != want {
				t.Errorf("README's loop differs from Example's (example_test.go), the loop's one source; copy it again.\nREADME:\n%s\nExample:\n%s", b[1], want)
			}
			return
		}
	}
	t.Error("README shows no loop that calls Boundary")
}

// TestEveryLoopFollowsTheExample: the loops of the examples and of gyre
// train take the example's steps in its order, keep a failed Wait from
// ending the loop, commit after a Redo, and end the job with Leave.
func TestEveryLoopFollowsTheExample(t *testing.T) {
	_, ref, refAfter := parseLoop(t, "example", "package x\nfunc f() {\n"+exampleLoop(t)+"\n}\n")
	want := stepsOf(ref)
	if !slices.Equal(want, loopSteps) {
		t.Fatalf("the example's steps are %v; this test expects %v: update loopSteps with the example", want, loopSteps)
	}
	if len(refAfter) == 0 || !calls(refAfter[len(refAfter)-1], "Leave") {
		t.Fatal("the example does not end the job with Leave after its loop")
	}
	files := []string{"internal/train/train.go"}
	examples, err := filepath.Glob("examples/*/main.go")
	if err != nil || len(examples) == 0 {
		t.Fatalf("no examples found: %v", err)
	}
	for _, name := range append(files, examples...) {
		src, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		fset, loop, _ := parseLoop(t, name, string(src))
		if got := stepsOf(loop); !subsequence(want, got) {
			t.Errorf("%s's loop takes the steps %v; the example's, in order, are %v", name, got, want)
		}
		if fatalWait(loop) {
			t.Errorf("%s's loop ends on any error of Wait; a lost worker is recovered by Boundary (see the example)", name)
		}
		if skipsCommit(fset, loop) {
			t.Errorf("%s's loop skips Commit after a Redo; commit after every Boundary that returns no error", name)
		}
	}
}

// subsequence reports whether want appears in got in its order.
func subsequence(want, got []string) bool {
	i := 0
	for _, g := range got {
		if i < len(want) && g == want[i] {
			i++
		}
	}
	return i == len(want)
}

// TestLoopChecksCatchOldLoops: a loop as the docs showed it two weeks ago
// (a failed Wait fatal, no Commit after a Redo) fails the checks.
func TestLoopChecksCatchOldLoops(t *testing.T) {
	old := `package x
func f() {
	for w.Iter() < iters {
		b := w.Batch()
		w.AllReduceAsync64(ctx, "grad", grad)
		if err := w.Wait(ctx); err != nil {
			log.Fatal(err)
		}
		change, err := w.Boundary(ctx)
		if err != nil {
			log.Fatal(err)
		}
		if change.Left {
			return
		}
		if change.Redo {
			continue
		}
		w.Commit()
	}
}`
	fset, loop, _ := parseLoop(t, "old", old)
	if !fatalWait(loop) || !skipsCommit(fset, loop) {
		t.Errorf("an old loop passes: fatal Wait %v, skipped Commit %v", fatalWait(loop), skipsCommit(fset, loop))
	}
	if got := stepsOf(loop); subsequence(loopSteps, got) {
		t.Errorf("steps %v, Left read before Redo, pass as the example's order %v", got, loopSteps)
	}
}
