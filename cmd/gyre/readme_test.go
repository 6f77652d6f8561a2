package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// cliReference is the CLI reference, relative to this package, and the
// name the failures give it. README links it.
const (
	cliReference = "../../docs/cli.md"
	cliRefName   = "docs/cli.md"
)

// TestCLIReference checks the CLI reference against the commands
// themselves, so that it cannot drift: every command has a section,
// headed "## `gyre SUBCOMMAND`", whose table rows name its flags (the
// first cell, in backquotes: "`-n`, `--nproc N`"), and the flags a
// section names are exactly those its command's --help lists under
// "Flags:", shorthands included, --help aside. The global flags belong to
// the "## `gyre`" section. Hidden commands (the children a benchmark
// starts) and cobra's own help and completion are left out.
func TestCLIReference(t *testing.T) {
	b, err := os.ReadFile(cliReference)
	if err != nil {
		t.Fatalf("the CLI reference: %v", err)
	}
	ref := parseReference(string(b))
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), "("+cliRefName+")") {
		t.Errorf("README.md does not link the CLI reference (%s)", cliRefName)
	}

	seen := map[string]bool{}
	for _, path := range commandPaths(newRootCmd(testEnv(nil)), nil) {
		name := strings.Join(append([]string{"gyre"}, path...), " ")
		seen[name] = true
		out, _, err := run(t, testEnv(nil), append(path, "--help")...)
		if err != nil {
			t.Fatalf("%s --help: %v", name, err)
		}
		help := helpFlags(out)
		documented, ok := ref[name]
		if !ok {
			t.Errorf("%s has no section for `%s`: add \"## `%s`\" with a table of its flags %v", cliRefName, name, name, help)
			continue
		}
		for _, f := range help {
			if !slices.Contains(documented, f) {
				t.Errorf("`%s --help` lists %s, but %s's `%s` section does not", name, f, cliRefName, name)
			}
		}
		for _, f := range documented {
			if !slices.Contains(help, f) {
				t.Errorf("%s's `%s` section names %s, which `%s --help` does not list", cliRefName, name, f, name)
			}
		}
	}
	for name := range ref {
		if !seen[name] {
			t.Errorf("%s has a section for `%s`, which is not a command", cliRefName, name)
		}
	}
}

// commandPaths lists the arguments that reach every command under c,
// c's own (path) first, hidden commands and cobra's help and completion
// aside.
func commandPaths(c *cobra.Command, path []string) [][]string {
	paths := [][]string{path}
	for _, sub := range c.Commands() {
		if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
			continue
		}
		paths = append(paths, commandPaths(sub, append(slices.Clone(path), sub.Name()))...)
	}
	return paths
}

// helpFlag matches a flag line of cobra's help: "  -n, --nproc int  ...".
var helpFlag = regexp.MustCompile(`^\s+(?:(-[a-zA-Z]), )?(--[a-z0-9-]+)`)

// helpFlags returns the flags, and their shorthands, that a --help output
// lists under "Flags:", --help and -h aside, sorted.
func helpFlags(help string) []string {
	var flags []string
	in := false
	for _, line := range strings.Split(help, "\n") {
		switch {
		case line == "Flags:":
			in = true
			continue
		case strings.TrimSpace(line) == "" || !strings.HasPrefix(line, " "):
			in = false
		}
		m := helpFlag.FindStringSubmatch(line)
		if !in || m == nil || m[2] == "--help" {
			continue
		}
		if m[1] != "" {
			flags = append(flags, m[1])
		}
		flags = append(flags, m[2])
	}
	slices.Sort(flags)
	return flags
}

var (
	refSection = regexp.MustCompile("^## `(gyre(?: [a-z]+)*)`\\s*$")
	refCode    = regexp.MustCompile("`([^`]+)`")
)

// parseReference returns the flags each command's section names in the
// first cell of its table rows, sorted, by command ("gyre bench
// allreduce").
func parseReference(doc string) map[string][]string {
	ref := map[string][]string{}
	section := ""
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "## ") {
			section = ""
			if m := refSection.FindStringSubmatch(line); m != nil {
				section = m[1]
				ref[section] = ref[section][:0:0]
			}
			continue
		}
		if section == "" || !strings.HasPrefix(line, "| ") {
			continue
		}
		cell := strings.SplitN(line, "|", 3)[1]
		for _, m := range refCode.FindAllStringSubmatch(cell, -1) {
			if f := strings.Fields(m[1]); len(f) > 0 && strings.HasPrefix(f[0], "-") {
				ref[section] = append(ref[section], f[0])
			}
		}
	}
	for name := range ref {
		slices.Sort(ref[name])
		ref[name] = slices.Compact(ref[name])
	}
	return ref
}
