package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/internal/secret"
)

func TestKeygenFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cluster.key")
	out, stderr, err := run(t, testEnv(nil), "keygen", "--out", path)
	if err != nil {
		t.Fatal(err)
	}
	if out != "" {
		t.Errorf("keygen --out printed %q to stdout", out)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if mode := st.Mode().Perm(); mode != 0o600 {
		t.Errorf("key file mode %v, want 0600", mode)
	}
	s, err := secret.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, s.Fingerprint()) || !strings.Contains(stderr, path) {
		t.Errorf("stderr %q lacks the path or fingerprint %s", stderr, s.Fingerprint())
	}
	if strings.Contains(stderr, s.Hex()) {
		t.Error("stderr shows the secret itself")
	}

	// A second keygen must not replace the key a job may depend on.
	before, _ := os.ReadFile(path)
	if _, _, err := run(t, testEnv(nil), "keygen", "--out", path); err == nil {
		t.Fatal("keygen overwrote an existing file")
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Fatal("the existing key file changed")
	}
}

func TestKeygenStdout(t *testing.T) {
	out, _, err := run(t, testEnv(nil), "keygen")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(out, "\n") || strings.Count(out, "\n") != 1 {
		t.Fatalf("stdout %q: want one line", out)
	}
	if _, err := secret.Parse(out); err != nil {
		t.Fatalf("stdout does not parse as a secret: %v", err)
	}
	out2, _, _ := run(t, testEnv(nil), "keygen")
	if out2 == out {
		t.Fatal("two keygens printed the same secret")
	}
}

func TestFlagErrors(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"--log-level", "loud", "keygen"}, `--log-level "loud", --log-format "auto": log level "loud": want debug, info, warn or error`},
		{[]string{"--log-format", "xml", "keygen"}, `log format "xml": want auto, json or console`},
		{[]string{"keygen", "--nope"}, "unknown flag: --nope"},
		{[]string{"keygen", "extra"}, "unknown command"},
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"bench", "transport", "--sizes", "4X"}, "--sizes"},
		{[]string{"bench", "transport", "--stripes", "0"}, "--stripes"},
		{[]string{"bench", "transport", "--transport", "quic", "--insecure"}, "--insecure"},
		{[]string{"bench", "transport", "--runs", "0"}, "--runs"},
		{[]string{"bench", "transport-peer"}, "GYRE_KEY"},
		{[]string{"bench", "transport", "--key-file", "/nonexistent/cluster.key"}, "--key-file"},
		{[]string{"launch", "-n", "0", "--", "true"}, "at least 1"},
		{[]string{"launch", "-n", "2"}, "requires at least 1 arg"},
		{[]string{"launch", "--insecure", "--", "true"}, "only available with the tcp"},
		{[]string{"launch", "--transport", "udp", "--", "true"}, `Transport "udp"`},
		{[]string{"launch", "--stripes", "99", "--", "true"}, "Stripes"},
		{[]string{"launch", "--key-file", "/nonexistent/cluster.key", "--", "true"}, "--key-file"},
		{[]string{"launch", "--", "/nonexistent/program"}, "/nonexistent/program"},
		{[]string{"bench", "allreduce", "--op", "prod"}, "--op"},
		{[]string{"bench", "allreduce", "--dtype", "bf16"}, "--dtype"},
		{[]string{"bench", "allreduce", "--op", "avg", "--dtype", "int32"}, "float --dtype"},
		{[]string{"bench", "allreduce", "--sizes", "6"}, "whole number"},
		{[]string{"bench", "allreduce", "-n", "0"}, "at least 1"},
		{[]string{"bench", "allreduce", "--iters", "-1"}, "negative"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, stderr, err := run(t, testEnv(nil), tt.args...)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not mention %q", err, tt.want)
			}
			if !strings.Contains(stderr, "Error: ") {
				t.Fatalf("stderr %q does not report the error", stderr)
			}
		})
	}
}

func TestLogger(t *testing.T) {
	var b strings.Builder
	log, err := newLogger(&b, "warn", "auto")
	if err != nil {
		t.Fatal(err)
	}
	log.Info().Msg("hidden")
	log.Warn().Msg("shown")
	if got := b.String(); strings.Contains(got, "hidden") || !strings.HasPrefix(got, `{"level":"warn"`) {
		t.Fatalf("auto on a non-terminal should log JSON at warn and above, got %q", got)
	}
	b.Reset()
	log, _ = newLogger(&b, "debug", "console")
	log.Debug().Str("k", "v").Msg("hello")
	if got := b.String(); strings.HasPrefix(got, "{") || !strings.Contains(got, "hello") || !strings.Contains(got, "k=v") {
		t.Fatalf("console format, got %q", got)
	}
}
