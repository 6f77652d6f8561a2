package main

import (
	"regexp"
	"strings"
	"testing"
)

// TestTrainMultiProcess runs `gyre launch -n 2 -- train` over real QUIC
// and checks the report: progress rows, equal shares and the summary.
func TestTrainMultiProcess(t *testing.T) {
	out, stderr, err := run(t, testEnv(nil), "--log-level", "warn", "launch", "-n", "2", "--",
		"train", "--iters", "60", "--eval-every", "30", "--batch", "64", "--balance", "static")
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, stderr)
	}
	row := regexp.MustCompile(`(?m)^\[0\] +(30|60) +[0-9.]+ +[0-9.]+% +[0-9]+  32,32$`)
	if n := len(row.FindAllString(out, -1)); n != 2 {
		t.Fatalf("want 2 progress rows with shares 32,32, got %d in:\n%s", n, out)
	}
	if !strings.Contains(out, "2 workers") || !strings.Contains(out, "after 60 iterations") {
		t.Fatalf("no summary in:\n%s", out)
	}
	digests := regexp.MustCompile(`(?m)^\[([01])\] # rank ([01]) final state digest ([0-9a-f]{16}) at iteration 60$`).FindAllStringSubmatch(out, -1)
	if len(digests) != 2 || digests[0][3] != digests[1][3] || digests[0][1] != digests[0][2] || digests[1][1] != digests[1][2] {
		t.Fatalf("want both ranks to print the same final digest, got %q in:\n%s", digests, out)
	}
}

func TestTrainRejectsBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"train", "--iters", "0"},
		{"train", "--target-acc", "2"},
		{"train", "--shares", "3,x"},
		{"train", "--seed", "127.0.0.1:7946"},
		{"train", "--seed", "127.0.0.1:7946", "--peers", "127.0.0.1:1,127.0.0.1:2", "--key-file", "k"},
	} {
		if _, _, err := run(t, testEnv(nil), args...); err == nil {
			t.Errorf("%v: no error", args)
		}
	}
	_, _, err := run(t, testEnv(nil), "train", "--seed", "127.0.0.1:7946")
	if err == nil || !strings.Contains(err.Error(), "gossip needs the cluster secret") {
		t.Fatalf("--seed without a key: %v", err)
	}
}
