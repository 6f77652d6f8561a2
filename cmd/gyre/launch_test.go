package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/secret"
)

// launchLines runs `gyre launch` with args and returns its stdout lines
// sorted, and its stderr.
func launchLines(t *testing.T, vars map[string]string, args ...string) ([]string, string, error) {
	t.Helper()
	out, stderr, err := run(t, testEnv(vars), append([]string{"--log-level", "warn", "launch"}, args...)...)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	sort.Strings(lines)
	return lines, stderr, err
}

func TestLaunchPassesTheStaticView(t *testing.T) {
	script := `echo "$GYRE_RANK $GYRE_WORLD_SIZE $GYRE_LOCAL_RANK $GYRE_DATA_ADDR $GYRE_PEERS $GYRE_TRANSPORT $GYRE_STRIPES $GYRE_KEY_FILE"; ` +
		`test -r "$GYRE_KEY_FILE" || echo "unreadable key"`
	// A stale variable in the parent must not reach the workers.
	lines, stderr, err := launchLines(t, map[string]string{"GYRE_RANK": "9"}, "-n", "3", "--static", "--stripes", "2", "--", "sh", "-c", script)
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	if len(lines) != 3 {
		t.Fatalf("want 3 lines, got %q", lines)
	}
	var peers, keyFile string
	for r, l := range lines {
		f := strings.Fields(strings.TrimPrefix(l, "["+string(rune('0'+r))+"] "))
		if len(f) != 8 || f[0] != string(rune('0'+r)) || f[1] != "3" || f[2] != f[0] || f[5] != "quic" || f[6] != "2" {
			t.Fatalf("rank %d line %q", r, l)
		}
		list := strings.Split(f[4], ",")
		if len(list) != 3 || list[r] != f[3] || (peers != "" && f[4] != peers) || (keyFile != "" && f[7] != keyFile) {
			t.Fatalf("rank %d sees data %s, peers %s, key %s; others saw %s, %s", r, f[3], f[4], f[7], peers, keyFile)
		}
		peers, keyFile = f[4], f[7]
	}
	if list := strings.Split(peers, ","); list[0] == list[1] || list[1] == list[2] || list[0] == list[2] {
		t.Fatalf("peer addresses repeat: %s", peers)
	}
	if _, err := os.Stat(keyFile); !os.IsNotExist(err) {
		t.Fatalf("ephemeral key file %s still there after the job: %v", keyFile, err)
	}
	if !strings.Contains(stderr, "ephemeral, removed at exit") {
		t.Fatalf("launch did not say where the key is: %s", stderr)
	}
}

func TestLaunchPassesASeed(t *testing.T) {
	script := `echo "$GYRE_LOCAL_RANK listen=$GYRE_LISTEN data=$GYRE_DATA_ADDR seed=$GYRE_SEED min=$GYRE_MIN_WORKERS ` +
		`timing=$GYRE_GOSSIP_TIMING log=$GYRE_LOG_LEVEL peers=$GYRE_PEERS rank=$GYRE_RANK launcher=$GYRE_LAUNCHER"`
	lines, stderr, err := launchLines(t, map[string]string{"GYRE_SEED": "10.9.9.9:1", "GYRE_LAUNCHER": "x"}, "-n", "3", "--", "sh", "-c", script)
	if err != nil || len(lines) != 3 {
		t.Fatalf("%q %v\n%s", lines, err, stderr)
	}
	seen := map[string]bool{}
	var seed string
	for r, l := range lines {
		f := strings.Fields(strings.TrimPrefix(l, "["+string(rune('0'+r))+"] "))
		kv := map[string]string{}
		for _, p := range f[1:] {
			k, v, _ := strings.Cut(p, "=")
			kv[k] = v
		}
		if f[0] != string(rune('0'+r)) || kv["min"] != "3" || kv["timing"] != "local" || kv["log"] != "warn" || kv["launcher"] != "launch" ||
			kv["peers"] != "" || kv["rank"] != "" || seen[kv["listen"]] || seen[kv["data"]] {
			t.Fatalf("rank %d environment %q", r, l)
		}
		seen[kv["listen"]], seen[kv["data"]] = true, true
		switch {
		case r == 0 && kv["seed"] != "":
			t.Fatalf("rank 0 must start the job, got seed %q", kv["seed"])
		case r == 0:
			seed = kv["listen"]
		case kv["seed"] != seed:
			t.Fatalf("rank %d joins through %q, want rank 0's %q", r, kv["seed"], seed)
		}
	}
	if !strings.Contains(stderr, "seed "+seed) {
		t.Fatalf("launch did not print the seed %s: %s", seed, stderr)
	}
}

func TestLaunchKeyFileAndInsecure(t *testing.T) {
	keyPath := t.TempDir() + "/cluster.key"
	key, _ := secret.Generate()
	if err := key.WriteFile(keyPath); err != nil {
		t.Fatal(err)
	}
	lines, stderr, err := launchLines(t, nil, "-n", "2", "--key-file", keyPath, "--", "sh", "-c", `cat "$GYRE_KEY_FILE"`)
	if err != nil || len(lines) != 2 || !strings.HasSuffix(lines[0], key.Hex()) || !strings.HasSuffix(lines[1], key.Hex()) {
		t.Fatalf("workers read %q (%v)\n%s", lines, err, stderr)
	}
	if _, err := os.Stat(keyPath); err != nil {
		t.Fatalf("the user's key file was removed: %v", err)
	}
	// Gossip is encrypted even when the data plane is not.
	lines, stderr, err = launchLines(t, nil, "-n", "1", "--transport", "tcp", "--insecure", "--",
		"sh", "-c", `echo "$GYRE_INSECURE $(cat "$GYRE_KEY_FILE" | wc -c)"`)
	if err != nil || len(lines) != 1 || lines[0] != "[0] true 65" {
		t.Fatalf("insecure gossip worker saw %q (%v)\n%s", lines, err, stderr)
	}
	lines, stderr, err = launchLines(t, nil, "-n", "1", "--static", "--transport", "tcp", "--insecure", "--",
		"sh", "-c", `echo "$GYRE_INSECURE key=$GYRE_KEY_FILE"`)
	if err != nil || len(lines) != 1 || lines[0] != "[0] true key=" {
		t.Fatalf("insecure worker saw %q (%v)\n%s", lines, err, stderr)
	}
}

// killFromOutside kills with SIGKILL, as `kill -9` would, the worker that
// writes its pid to dir/pid, then creates dir/killed. The returned func
// waits for that and fails t if it could not.
func killFromOutside(t *testing.T, dir string) func() {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			b, err := os.ReadFile(filepath.Join(dir, "pid"))
			if err != nil {
				continue
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err == nil {
				err = syscall.Kill(pid, syscall.SIGKILL)
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(dir, "killed"), nil, 0o644)
			}
			done <- err
			return
		}
		done <- errors.New("no worker wrote its pid")
	}()
	return func() {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatalf("kill -9 from outside: %v", err)
		}
	}
}

// The victim of killFromOutside, and the others' wait for its death.
const (
	victimScript = `echo $$ > "$TEST_DIR/pid.tmp"; mv "$TEST_DIR/pid.tmp" "$TEST_DIR/pid"; exec sleep 30`
	awaitKill    = `while [ ! -e "$TEST_DIR/killed" ]; do sleep 0.05; done`
)

// TestLaunchGoesOnWithoutALostWorker: a worker killed by SIGKILL from
// outside is a lost rank. The others go on past --grace and finish, and
// launch exits 0, naming the lost rank in its last line.
func TestLaunchGoesOnWithoutALostWorker(t *testing.T) {
	dir := t.TempDir()
	killed := killFromOutside(t, dir)
	script := `if [ "$GYRE_LOCAL_RANK" = 2 ]; then ` + victimScript + `; fi
	` + awaitKill + `; sleep 0.8; echo "done $GYRE_LOCAL_RANK"`
	lines, stderr, err := launchLines(t, map[string]string{"TEST_DIR": dir}, "-n", "3", "--grace", "200ms", "--", "sh", "-c", script)
	killed()
	if err != nil {
		t.Fatalf("launch = %v, want success: the job finished without worker [2]\n%s", err, stderr)
	}
	if got := strings.Join(lines, "|"); got != "[0] done 0|[1] done 1" {
		t.Fatalf("stdout %q: the others did not go on after the loss\n%s", got, stderr)
	}
	all := strings.Split(strings.TrimSpace(stderr), "\n")
	if last, want := all[len(all)-1], "gyre launch: the job finished without 1 of 3 workers: rank 2 killed by signal 9 (killed)"; last != want {
		t.Fatalf("last line %q, want %q\n%s", last, want, stderr)
	}
}

// TestLaunchStopsTheJobWithoutQuorum: a worker exiting with
// gyre.ExitNoQuorum stops the others at once, and launch exits with it.
func TestLaunchStopsTheJobWithoutQuorum(t *testing.T) {
	script := `if [ "$GYRE_LOCAL_RANK" = 1 ]; then sleep 0.3; exit ` + strconv.Itoa(gyre.ExitNoQuorum) + `; fi; exec sleep 30`
	start := time.Now()
	_, stderr, err := launchLines(t, nil, "-n", "3", "--grace", "2s", "--", "sh", "-c", script)
	var ee *exitError
	if !errors.As(err, &ee) || ee.ExitCode() != gyre.ExitNoQuorum {
		t.Fatalf("launch = %v, want exit status %d\n%s", err, gyre.ExitNoQuorum, stderr)
	}
	for _, want := range []string{"worker [1] lost its quorum, exit status 75", "the workers still running were stopped"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("launch = %v, want it to say %q", err, want)
		}
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("took %v: the others were not stopped", d)
	}
}

// TestLaunchExitsWithTheFirstFailure: when every worker fails, launch exits
// with the first failure's status, here 128+9 as a shell's for a worker
// killed by SIGKILL; the others' reports reach the output, and the error
// names the rank they name.
func TestLaunchExitsWithTheFirstFailure(t *testing.T) {
	dir := t.TempDir()
	killed := killFromOutside(t, dir)
	script := `if [ "$GYRE_LOCAL_RANK" = 3 ]; then ` + victimScript + `; fi
	` + awaitKill + `; sleep 0.5
	echo "Error: gyre: lost rank 3 (127.0.0.1:9) in iteration 7: peer gone" >&2; exit 1`
	_, stderr, err := launchLines(t, map[string]string{"TEST_DIR": dir}, "-n", "4", "--static", "--grace", "3s", "--", "sh", "-c", script)
	killed()
	var ee *exitError
	if !errors.As(err, &ee) || ee.ExitCode() != 137 {
		t.Fatalf("launch = %v, want exit status 137\n%s", err, stderr)
	}
	for _, want := range []string{"the reports of workers [0] [1] [2] name rank 3: gyre: lost rank 3", "worker [3] failed first, killed by signal 9"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("launch = %v, want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "stopped") {
		t.Fatalf("launch = %v: no worker was running to stop", err)
	}
	for _, r := range []string{"[0]", "[1]", "[2]"} {
		if !strings.Contains(stderr, r+" Error: gyre: lost rank 3") {
			t.Fatalf("worker %s's report was not printed:\n%s", r, stderr)
		}
	}
}

// TestLaunchWorkersLogWarnings: the workers log warnings and errors
// unless the user gives a level.
func TestLaunchWorkersLogWarnings(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "[0] warn"},
		{[]string{"--log-level", "info"}, "[0] info"},
		{[]string{"--log-level", "debug"}, "[0] debug"},
	} {
		args := append(tc.args, "launch", "-n", "1", "--", "sh", "-c", `echo $GYRE_LOG_LEVEL`)
		out, stderr, err := run(t, testEnv(nil), args...)
		if err != nil || strings.TrimSpace(out) != tc.want {
			t.Fatalf("%v: workers saw %q (%v), want %q\n%s", tc.args, out, err, tc.want, stderr)
		}
	}
	help, _, _ := run(t, testEnv(nil), "launch", "--help")
	help = strings.Join(strings.Fields(help), " ")
	for _, want := range []string{"[N] is the launch index; the rank can change after a view change, and log lines carry rank=",
		"128+signal", "--grace"} {
		if !strings.Contains(help, want) {
			t.Fatalf("launch --help does not say %q:\n%s", want, help)
		}
	}
}

func TestLaunchRunsGyreSubcommands(t *testing.T) {
	t.Parallel() // other processes' jobs: mostly waiting, little CPU
	lines, stderr, err := launchLines(t, nil, "-n", "2", "--", "keygen")
	hex := regexp.MustCompile(`^\[[01]\] [0-9a-f]{64}$`)
	if err != nil || len(lines) != 2 || !hex.MatchString(lines[0]) || !hex.MatchString(lines[1]) || lines[0][4:] == lines[1][4:] {
		t.Fatalf("launch -- keygen printed %q (%v)\n%s", lines, err, stderr)
	}
}

func TestWorkerProcs(t *testing.T) {
	none := func(string) (string, bool) { return "", false }
	set := func(v string) func(string) (string, bool) {
		return func(k string) (string, bool) { return v, k == "GOMAXPROCS" }
	}
	for _, tc := range []struct {
		lookup      func(string) (string, bool)
		cores, n    int
		want        int
		fromEnvWant bool
	}{
		{none, 2, 4, 1, false}, // more workers than cores: one each
		{none, 2, 2, 1, false},
		{none, 8, 2, 4, false},
		{none, 8, 3, 2, false},
		{none, 2, 1, 2, false},
		{set("3"), 2, 4, 3, true}, // the user's choice wins
		{set("x"), 8, 2, 4, false},
		{set("0"), 8, 2, 4, false},
	} {
		got, fromEnv := workerProcs(tc.lookup, tc.cores, tc.n)
		if got != tc.want || fromEnv != tc.fromEnvWant {
			t.Errorf("workerProcs(cores %d, n %d) = %d, %v; want %d, %v", tc.cores, tc.n, got, fromEnv, tc.want, tc.fromEnvWant)
		}
	}
}

// TestLaunchMetricsAddr: --metrics-addr gives rank i port+i, prints where,
// and a malformed address is refused before any worker starts.
func TestLaunchMetricsAddr(t *testing.T) {
	lines, stderr, err := launchLines(t, nil, "-n", "3", "--metrics-addr", "127.0.0.1:19400", "--", "sh", "-c", `echo "$GYRE_LOCAL_RANK $GYRE_METRICS_ADDR"`)
	if err != nil || len(lines) != 3 {
		t.Fatalf("%q %v\n%s", lines, err, stderr)
	}
	for r, l := range lines {
		if want := fmt.Sprintf("[%d] %d 127.0.0.1:%d", r, r, 19400+r); l != want {
			t.Errorf("rank %d: %q, want %q", r, l, want)
		}
	}
	if !strings.Contains(stderr, "http://127.0.0.1:19400/ ([0]) to http://127.0.0.1:19402/ ([2])") {
		t.Errorf("launch did not print the metrics addresses:\n%s", stderr)
	}
	// Port 0: launch picks free ports itself, to print them.
	lines, stderr, err = launchLines(t, nil, "-n", "2", "--metrics-addr", "127.0.0.1:0", "--", "sh", "-c", `echo "$GYRE_METRICS_ADDR"`)
	if err != nil || len(lines) != 2 || strings.HasSuffix(lines[0], ":0") || lines[0][4:] == lines[1][4:] ||
		!strings.Contains(stderr, "http://"+lines[0][4:]+"/") {
		t.Fatalf("port 0: %q %v\n%s", lines, err, stderr)
	}
	for _, bad := range []string{"19400", "127.0.0.1:x", "127.0.0.1:65535"} {
		if _, _, err := launchLines(t, nil, "-n", "3", "--metrics-addr", bad, "--", "true"); err == nil || !strings.Contains(err.Error(), "--metrics-addr") {
			t.Errorf("--metrics-addr %s for 3 workers: %v, want an error naming the flag", bad, err)
		}
	}
}

// TestLaunchTimeline: --timeline gives each rank its own file.
func TestLaunchTimeline(t *testing.T) {
	lines, stderr, err := launchLines(t, nil, "-n", "2", "--timeline", "out/t.json", "--", "sh", "-c", `echo "$GYRE_LOCAL_RANK $GYRE_TIMELINE"`)
	if err != nil || len(lines) != 2 {
		t.Fatalf("%q %v\n%s", lines, err, stderr)
	}
	for r, l := range lines {
		if want := fmt.Sprintf("[%d] %d out/t.rank%d.json", r, r, r); l != want {
			t.Errorf("rank %d: %q, want %q", r, l, want)
		}
	}
}

// TestLaunchRestartsRejoinThroughTheLiveWorkers: a worker started again
// (--max-restarts) has the running workers' gossip addresses for seeds,
// also rank 0, which started the job without one; its own environment is
// kept otherwise.
func TestLaunchRestartsRejoinThroughTheLiveWorkers(t *testing.T) {
	dir := t.TempDir()
	// [1] fails at its first start; [0] and [2] wait for its second.
	script := `N=$(( $(cat "$TEST_DIR/n$GYRE_LOCAL_RANK" 2>/dev/null || echo 0) + 1 )); echo $N > "$TEST_DIR/n$GYRE_LOCAL_RANK"
	if [ "$GYRE_LOCAL_RANK" = 1 ] && [ $N = 1 ]; then exit 3; fi
	echo "$GYRE_LOCAL_RANK start=$N listen=$GYRE_LISTEN seed=$GYRE_SEED launcher=$GYRE_LAUNCHER"
	if [ "$GYRE_LOCAL_RANK" != 1 ]; then until [ -e "$TEST_DIR/n1" ] && [ "$(cat "$TEST_DIR/n1")" = 2 ]; do sleep 0.05; done; sleep 0.3; fi`
	lines, stderr, err := launchLines(t, map[string]string{"TEST_DIR": dir}, "-n", "3", "--max-restarts", "1", "--", "sh", "-c", script)
	if err != nil || len(lines) != 3 {
		t.Fatalf("launch = %v, lines %q\n%s", err, lines, stderr)
	}
	kv := func(l string) map[string]string {
		m := map[string]string{}
		for _, f := range strings.Fields(l)[2:] {
			k, v, _ := strings.Cut(f, "=")
			m[k] = v
		}
		return m
	}
	w0, w1, w2 := kv(lines[0]), kv(lines[1]), kv(lines[2])
	if w1["start"] != "2" || w1["launcher"] != "launch" || w1["listen"] == "" {
		t.Fatalf("[1] after its restart: %q", lines[1])
	}
	if want := w0["listen"] + "," + w2["listen"]; w1["seed"] != want {
		t.Fatalf("[1] restarted with seeds %q, want the running [0] and [2]: %q", w1["seed"], want)
	}
	if !strings.Contains(stderr, "gyre launch: rank 1 exited with status 3; starting it again in 1s (restart 1 of 1)") {
		t.Fatalf("launch did not say it restarts [1]:\n%s", stderr)
	}
	env := rejoinEnv(func(int) []string { return []string{"A=1", gyre.EnvListen + "=g0"} }, []string{"g0", "g1", "g2"})(0, []int{1, 2})
	if strings.Join(env, " ") != "A=1 "+gyre.EnvListen+"=g0 "+gyre.EnvSeed+"=g1,g2" {
		t.Fatalf("rank 0 started again: %q, want seeds g1,g2", env)
	}
}

func TestLaunchRefusesBadRestarts(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--max-restarts", "-1"}, "--max-restarts -1: want 0 or more"},
		{[]string{"--max-restarts", "2", "--static"}, "--max-restarts with --static"},
		{[]string{"--max-restarts", "2", "-n", "1"}, "--max-restarts with -n 1"},
	} {
		lines, stderr, err := launchLines(t, nil, append(append([]string{"-n", "2"}, tc.args...), "--", "sh", "-c", "echo worker-ran")...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(strings.Join(lines, "\n"), "worker-ran") {
			t.Errorf("launch %v = %v, want %q before any worker starts\n%s", tc.args, err, tc.want, stderr)
		}
	}
}

// TestLaunchRefusesASharedOutputFile: a per-worker file flag given to
// every worker of a gyre command without {i} is refused before any
// worker starts, with the placeholder to use; with {i}, or after the
// command's own --, it is not (one worker, or a program of the user's,
// is never checked).
func TestLaunchRefusesASharedOutputFile(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "2", "--", "train", "--timeline", "t.json"},
			"--timeline t.json would be written by every worker: put {i} in its name, which launch replaces with each worker's launch index (--timeline t-{i}.json); or give it to launch"},
		{[]string{"-n", "2", "--", "train", "--metrics-file=m.jsonl"}, "--metrics-file m.jsonl would be written by every worker"},
		{[]string{"-n", "3", "--", "train", "--save-params", "p"}, "(--save-params p-{i})"},
		{[]string{"-n", "2", "--", "train", "--cpu-profile", "c.pprof"}, "gyre --cpu-profile p launch"},
	} {
		dir := t.TempDir()
		lines, stderr, err := launchLines(t, map[string]string{"PWD": dir}, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(stderr, "workers on 127.0.0.1") {
			t.Errorf("launch %v: %v, want %q before anything starts\n%q\n%s", tc.args, err, tc.want, lines, stderr)
		}
	}
	for _, args := range [][]string{{"--timeline", "t-{i}.json", "--metrics-file={i}.jsonl"}, {"--iters", "5", "--", "--timeline", "t.json"}} {
		if err := sharedOutput(args); err != nil {
			t.Errorf("%v: %v, want it accepted", args, err)
		}
	}
}
