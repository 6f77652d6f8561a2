package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/membership"
)

// keyFile writes a fresh cluster secret to a file and returns both.
func keyFile(t *testing.T) (secret.Secret, string) {
	t.Helper()
	s, err := secret.Generate()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cluster.key")
	if err := s.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return s, path
}

// gossipNode starts a real memberlist node on loopback with meta, joined
// through seed if one is given.
func gossipNode(t *testing.T, s secret.Secret, name, seed string, meta membership.Meta) *membership.Node {
	t.Helper()
	n, err := membership.Start(membership.Config{Name: name, Listen: "127.0.0.1:0", Key: s.GossipKey(), Local: true,
		Meta: meta, Logger: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	if seed != "" {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		if err := n.Join(ctx, []string{seed}); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// TestMembersListsTheJob: gyre members, as an observer of real gossip,
// lists two workers in a view and a pending one, sorted by rank, as a
// table and as JSON, and never itself.
func TestMembersListsTheJob(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	s, path := keyFile(t)
	w0 := gossipNode(t, s, "w0", "", membership.Meta{DataAddr: "127.0.0.1:9001", Job: "j", Role: membership.RoleWorker, Epoch: 3, Rank: 1, Device: "cpu"})
	gossipNode(t, s, "w1", w0.Addr(), membership.Meta{DataAddr: "127.0.0.1:9002", Job: "j", Role: membership.RoleWorker, Epoch: 3, Rank: 0, Device: "cpu"})
	gossipNode(t, s, "w2", w0.Addr(), membership.Meta{DataAddr: "127.0.0.1:9003", Job: "j", Role: membership.RoleWorker, Rank: -1})

	out, stderr, err := run(t, testEnv(nil), "members", "--seed", w0.Addr(), "--key-file", path, "--json", "--wait", "500ms")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	var rows []memberRow
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	want := []struct {
		id, data string
		rank     int32
		pending  bool
	}{{"w1", "127.0.0.1:9002", 0, false}, {"w0", "127.0.0.1:9001", 1, false}, {"w2", "127.0.0.1:9003", -1, true}}
	if len(rows) != len(want) {
		t.Fatalf("got %d rows, want %d:\n%s", len(rows), len(want), out)
	}
	for i, w := range want {
		r := rows[i]
		if r.ID != w.id || r.DataAddr != w.data || r.Rank != w.rank || r.Pending != w.pending ||
			r.State != "alive" || r.Role != "worker" || r.GossipAddr == "" {
			t.Errorf("row %d: %+v, want %s at %s rank %d pending %v", i, r, w.id, w.data, w.rank, w.pending)
		}
	}
	if rows[0].Epoch != 3 || rows[1].Epoch != 3 {
		t.Errorf("epochs %d and %d, want 3", rows[0].Epoch, rows[1].Epoch)
	}

	out, _, err = run(t, testEnv(nil), "members", "--seed", w0.Addr(), "--key-file", path, "--wait", "200ms")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "ID") || !strings.HasPrefix(lines[1], "w1 ") ||
		!strings.Contains(lines[3], "pending") || strings.Contains(out, "observer") {
		t.Fatalf("table:\n%s", out)
	}
}

// TestMembersRefusesBadInput: no seed, no secret, a wrong secret and bad
// flags each fail with an error that says what to do.
func TestMembersRefusesBadInput(t *testing.T) {
	s, path := keyFile(t)
	w0 := gossipNode(t, s, "w0", "", membership.Meta{Role: membership.RoleWorker, Rank: -1})
	_, wrong := keyFile(t)
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"members", "--key-file", path}, "no seed to join"},
		{[]string{"members", "--seed", w0.Addr()}, "cluster secret is required"},
		{[]string{"members", "--seed", w0.Addr(), "--key-file", "/nonexistent/cluster.key"}, "--key-file"},
		{[]string{"members", "--seed", w0.Addr(), "--key-file", path, "--wait", "-1s"}, "--wait"},
		{[]string{"members", "--seed", w0.Addr(), "--key-file", path, "--listen", "0.0.0.0:0"}, "explicit address"},
		{[]string{"members", "--seed", w0.Addr(), "--key-file", wrong, "--join-timeout", "2s"}, "the secret may differ"},
	} {
		t.Run(strings.Join(tt.args[1:], " "), func(t *testing.T) {
			_, _, err := run(t, testEnv(map[string]string{"GYRE_KEY": "", "GYRE_KEY_FILE": "", "GYRE_SEED": ""}), tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tt.want)
			}
		})
	}
}

// TestBenchGossip runs the gossip benchmark in-process and with a process
// per node, and checks the report.
func TestBenchGossip(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	for _, procs := range []bool{false, true} {
		args := []string{"bench", "gossip", "-n", "3", "--runs", "2", "--timeout", "30s"}
		if procs {
			args = append(args, "--procs")
		}
		jsonFile := filepath.Join(t.TempDir(), "gossip.json")
		out, stderr, err := run(t, testEnv(nil), append(args, "--json", jsonFile)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		var rep GossipReport
		raw, err := os.ReadFile(jsonFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &rep); err != nil {
			t.Fatal(err)
		}
		if rep.N != 3 || len(rep.RunsMS) != 2 || rep.MedianMS <= 0 || (rep.Mode == "procs") != procs {
			t.Fatalf("report %+v", rep)
		}
		for _, ms := range rep.RunsMS {
			if ms <= 0 || ms > 30e3 {
				t.Fatalf("run took %v ms", ms)
			}
		}
		if !strings.Contains(out, "med") {
			t.Fatalf("table:\n%s", out)
		}
	}
	if _, _, err := run(t, testEnv(nil), "bench", "gossip", "-n", "1"); err == nil || !strings.Contains(err.Error(), "-n must be at least 2") {
		t.Fatalf("-n 1: %v", err)
	}
}
