package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// syncBuffer is a bytes.Buffer safe for the launcher's concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runSh(t *testing.T, n int, script string, adjust func(*Options)) (string, string, error) {
	t.Helper()
	var out, errb syncBuffer
	o := Options{
		N:        n,
		Argv:     []string{"sh", "-c", script},
		Env:      func(r int) []string { return append(os.Environ(), fmt.Sprintf("RANK=%d", r)) },
		Stdout:   &out,
		Stderr:   &errb,
		Grace:    2 * time.Second,
		NoQuorum: noQuorum,
	}
	if adjust != nil {
		adjust(&o)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, o)
	return out.String(), errb.String(), err
}

// noQuorum is the no-quorum status the tests' workers exit with, as
// gyre.ExitNoQuorum (this package does not import gyre).
const noQuorum = 75

// killFromOutside kills with SIGKILL, as `kill -9` from a shell would, the
// worker that writes its pid to dir/pid, then creates dir/killed. The
// returned func waits for that and fails t if it could not.
func killFromOutside(t *testing.T, dir string) func() {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			b, err := os.ReadFile(filepath.Join(dir, "pid"))
			if err != nil {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			var pid int
			if _, err := fmt.Sscan(string(b), &pid); err != nil {
				done <- err
				return
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				done <- err
				return
			}
			done <- os.WriteFile(filepath.Join(dir, "killed"), nil, 0o644)
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

// inDir adds DIR=dir to every worker's environment.
func inDir(dir string, adjust func(*Options)) func(*Options) {
	return func(o *Options) {
		env := o.Env
		o.Env = func(r int) []string { return append(env(r), "DIR="+dir) }
		if adjust != nil {
			adjust(o)
		}
	}
}

// The victim's script: it writes its pid for killFromOutside and sleeps.
const victim = `echo $$ > "$DIR/pid.tmp"; mv "$DIR/pid.tmp" "$DIR/pid"; exec sleep 30`

// awaitKill is the others' script: wait until the victim was killed.
const awaitKill = `while [ ! -e "$DIR/killed" ]; do sleep 0.05; done`

func sortedLines(s string) []string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	sort.Strings(lines)
	return lines
}

func TestRunPrefixesEveryLine(t *testing.T) {
	defer goleak.VerifyNone(t)
	out, errs, err := runSh(t, 3, `echo "out $RANK"; echo "err $RANK" >&2; printf "partial $RANK"`, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"[0] out 0", "[0] partial 0", "[1] out 1", "[1] partial 1", "[2] out 2", "[2] partial 2"}
	if got := sortedLines(out); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Fatalf("stdout lines %q, want %q", got, want)
	}
	if got := sortedLines(errs); strings.Join(got, "|") != "[0] err 0|[1] err 1|[2] err 2" {
		t.Fatalf("stderr lines %q", got)
	}
}

// TestRunGoesOnWithoutALostRank: a worker killed from outside by SIGKILL
// is lost, not the end of the job. The others go on well past the grace
// period, are not stopped, and exit 0; Run reports the job finished
// without the lost worker, naming it.
func TestRunGoesOnWithoutALostRank(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	killed := killFromOutside(t, dir)
	script := `if [ "$RANK" = 2 ]; then ` + victim + `; fi
	` + awaitKill + `; sleep 1; echo "done $RANK"`
	out, _, err := runSh(t, 4, script, inDir(dir, func(o *Options) { o.Grace = 200 * time.Millisecond }))
	killed()
	var lost *LostError
	if !errors.As(err, &lost) || lost.N != 4 || len(lost.Lost) != 1 {
		t.Fatalf("Run = %v, want a *LostError naming worker [2] alone", err)
	}
	if x := lost.Lost[0]; x.Index != 2 || x.Signal != syscall.SIGKILL || x.Code != -1 {
		t.Fatalf("lost %+v, want worker [2] killed by SIGKILL", x)
	}
	if want := "the job finished without 1 of 4 workers: rank 2 killed by signal 9 (killed)"; err.Error() != want {
		t.Fatalf("error\n%s\nwant\n%s", err, want)
	}
	if got := strings.Join(sortedLines(out), "|"); got != "[0] done 0|[1] done 1|[3] done 3" {
		t.Fatalf("the others did not finish after the loss: stdout %q", got)
	}
}

// TestRunStopsTheJobWithoutQuorum: a worker exiting with the no-quorum
// status ends the job at once. The others get SIGTERM (their trap runs),
// a worker lost before is named, and the status is the no-quorum one,
// although the workers stopped exit 0.
func TestRunStopsTheJobWithoutQuorum(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	script := `case $RANK in
	0|2) trap 'echo "stopped $RANK"; exit 0' TERM; touch "$DIR/ready-$RANK"; sleep 30 & wait ;;
	3) echo $$ > "$DIR/pid3.tmp"; mv "$DIR/pid3.tmp" "$DIR/pid3"; exit 1 ;;
	1) until [ -e "$DIR/ready-0" ] && [ -e "$DIR/ready-2" ] && [ -e "$DIR/pid3" ]; do sleep 0.05; done
	   while kill -0 "$(cat "$DIR/pid3")" 2>/dev/null; do sleep 0.05; done; sleep 0.2
	   echo "Error: gyre: no quorum" >&2; exit 75 ;;
	esac`
	start := time.Now()
	out, _, err := runSh(t, 4, script, inDir(dir, nil))
	took := time.Since(start)
	var re *RankError
	if !errors.As(err, &re) || !re.NoQuorum || !re.Stopped || re.Index != 1 || re.ExitCode() != noQuorum {
		t.Fatalf("Run = %#v, want worker [1]'s no-quorum status 75 and the others stopped", err)
	}
	if len(re.Lost) != 1 || re.Lost[0].Index != 3 || re.Lost[0].Code != 1 {
		t.Fatalf("lost before the stop: %+v, want worker [3] with status 1", re.Lost)
	}
	if want := "worker [1] lost its quorum, exit status 75 (lost before: rank 3 exited with status 1): gyre: no quorum"; err.Error() != want {
		t.Fatalf("error\n%s\nwant\n%s", err, want)
	}
	if got := strings.Join(sortedLines(out), "|"); got != "[0] stopped 0|[2] stopped 2" {
		t.Fatalf("stdout %q: workers [0] and [2] were not stopped by SIGTERM", got)
	}
	if took > 10*time.Second {
		t.Fatalf("took %v: the others were not stopped", took)
	}
}

func TestRunKillsRanksThatIgnoreSIGTERM(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	script := `if [ "$RANK" = 0 ]; then until [ -e "$DIR/ready" ]; do sleep 0.05; done; exit 75; fi
	trap "" TERM; touch "$DIR/ready"; while :; do sleep 0.1; done`
	start := time.Now()
	_, _, err := runSh(t, 2, script, inDir(dir, func(o *Options) { o.Grace = 500 * time.Millisecond }))
	took := time.Since(start)
	var re *RankError
	if !errors.As(err, &re) || re.Index != 0 || re.Code != noQuorum || !re.NoQuorum {
		t.Fatalf("Run = %v, want rank 0 with the no-quorum status", err)
	}
	if took < 500*time.Millisecond || took > 10*time.Second {
		t.Fatalf("took %v: the rank ignoring SIGTERM was not killed after the grace period", took)
	}
}

// TestRunExitsAsAShellForASignal: when every worker fails, the job's
// status is the first failure's: here a worker killed from outside by
// SIGKILL, so 128+9, as a shell's, not 1. The others' reports, which
// they printed as they failed on their own, name it.
func TestRunExitsAsAShellForASignal(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	killed := killFromOutside(t, dir)
	script := `if [ "$RANK" = 1 ]; then ` + victim + `; fi
	` + awaitKill + `; sleep 0.3; echo "Error: gyre: lost rank 1 (127.0.0.1:9) in iteration 2: peer gone" >&2; exit 1`
	_, errs, err := runSh(t, 3, script, inDir(dir, func(o *Options) { o.Grace = 200 * time.Millisecond }))
	killed()
	var re *RankError
	if !errors.As(err, &re) || re.Index != 1 || re.Signal != syscall.SIGKILL || re.ExitCode() != 137 || re.NoQuorum || re.Stopped {
		t.Fatalf("Run = %v, want worker [1] killed by signal 9, status 137", err)
	}
	if re.Named != 1 || fmt.Sprint(re.By) != "[0 2]" || len(re.Lost) != 2 {
		t.Fatalf("Run = %#v, want rank 1 named by workers [0] [2], both lost", re)
	}
	if !strings.Contains(err.Error(), "worker [1] failed first, killed by signal 9") {
		t.Fatalf("the error does not say how worker [1] died: %v", err)
	}
	if !strings.Contains(errs, "[0] Error: gyre: lost rank 1") || !strings.Contains(errs, "[2] Error: gyre: lost rank 1") {
		t.Fatalf("the workers' reports were not printed:\n%s", errs)
	}
}

// TestRunNamesTheRankTheReportsName: the worker that fails first is not
// always the one at fault. When every worker failed, the error names the
// rank the reports name, with the first worker's status.
func TestRunNamesTheRankTheReportsName(t *testing.T) {
	defer goleak.VerifyNone(t)
	script := `case $RANK in
	0) exit 4 ;;
	1|2) sleep 0.3; echo "some log line" >&2; echo "Error: gyre: lost rank 3 (127.0.0.1:9) in iteration 7: peer gone" >&2; exit 1 ;;
	*) sleep 0.6; exit 2 ;;
	esac`
	_, errs, err := runSh(t, 4, script, nil)
	var re *RankError
	if !errors.As(err, &re) || re.Index != 0 || re.ExitCode() != 4 || re.Named != 3 || fmt.Sprint(re.By) != "[1 2]" {
		t.Fatalf("Run = %#v, want worker [0]'s status 4 and rank 3 named by workers [1] [2]", err)
	}
	for _, r := range []string{"[1]", "[2]"} {
		if !strings.Contains(errs, r+" Error: gyre: lost rank 3") {
			t.Fatalf("worker %s's report was not printed:\n%s", r, errs)
		}
	}
	want := "the reports of workers [1] [2] name rank 3: gyre: lost rank 3 (127.0.0.1:9) in iteration 7: peer gone; worker [0] failed first, exit status 4"
	if err.Error() != want {
		t.Fatalf("error\n%s\nwant\n%s", err, want)
	}
}

// TestRunStartsTheOthersOnceTheFirstIsReady: a gossip seed listens
// before its joiners dial it.
func TestRunStartsTheOthersOnceTheFirstIsReady(t *testing.T) {
	defer goleak.VerifyNone(t)
	ready := filepath.Join(t.TempDir(), "ready")
	script := `if [ "$RANK" = 0 ]; then sleep 0.2; touch "$READY"; sleep 0.2; else test -e "$READY" || exit 9; fi`
	_, _, err := runSh(t, 3, script, func(o *Options) {
		env := o.Env
		o.Env = func(r int) []string { return append(env(r), "READY="+ready) }
		o.FirstReady = func(ctx context.Context) error {
			for ctx.Err() == nil {
				if _, err := os.Stat(ready); err == nil {
					return nil
				}
				time.Sleep(10 * time.Millisecond)
			}
			return ctx.Err()
		}
	})
	if err != nil {
		t.Fatalf("Run = %v: a worker started before the first was ready", err)
	}
}

func TestBlame(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reports [][]string
		want    int
		by      string
	}{
		{"none", [][]string{{"Error: exit"}, nil}, -1, "[]"},
		{"lost", [][]string{nil, {"Error: gyre: lost rank 2 (a) in iteration 3: eof"}}, 2, "[1]"},
		// The odd rank names every other; the others name it.
		{"diverged", [][]string{
			{"Error: gyre: workers diverged: rank 0 ended iteration 5, this worker 6", "gyre: workers diverged: rank 1 ended iteration 5, this worker 6"},
			{"Error: gyre: workers diverged: rank 2 ended iteration 6, this worker 5"},
			{"Error: gyre: workers diverged: rank 2 ended iteration 6, this worker 5"},
		}, 2, "[1 2]"},
		// A worker without quorum lists itself among the voters it reaches.
		{"no quorum", [][]string{{"Error: gyre: no quorum: this worker reaches 1 of the 2 voters of the view of epoch 2 " +
			"(rank 0 127.0.0.1:9 (this worker)) and needs 2; it does not hear rank 1 127.0.0.1:8; it waited 10s, after: lost rank 1"}}, 1, "[0]"},
		{"state", [][]string{{"Error: gyre: workers diverged: rank 1 holds a different state from rank 0 (digest 1, rank 0 2)"}}, 1, "[0]"},
		{"disagree", [][]string{{"Error: rank 0 ended iteration 5"}, {"Error: rank 1 ended iteration 6"}}, -1, "[]"},
		// log.Fatal's report, as an embedding trainer exits.
		{"log.Fatal", [][]string{{"2026/11/25 23:37:14 gyre: lost rank 0 (a) in iteration 9: eof"}}, 0, "[0]"},
		{"json", [][]string{{`{"level":"error","rank":1,"error":"gyre: lost rank 0 (a) in iteration 3"}`}}, 0, "[0]"},
	} {
		r, line, by := blame(tc.reports)
		if r != tc.want || fmt.Sprint(by) != tc.by {
			t.Errorf("%s: blame = rank %d by %v, want rank %d by %s", tc.name, r, by, tc.want, tc.by)
		}
		if strings.HasPrefix(line, "Error:") || strings.HasPrefix(line, "2026/") {
			t.Errorf("%s: blame quotes %q, want the report without its prefix or log time", tc.name, line)
		}
	}
}

func TestReportKeepsTheErrorLines(t *testing.T) {
	var r report
	for _, l := range []string{"log 1\n", "log 2\n", "Error: a\n", "b\n", "\n"} {
		r.add([]byte(l))
	}
	if got := strings.Join(r.get(), "|"); got != "Error: a|b" {
		t.Fatalf("report %q, want the Error line and the line after it", got)
	}
	var last report
	last.add([]byte("one\n"))
	last.add([]byte("two"))
	if got := strings.Join(last.get(), "|"); got != "two" {
		t.Fatalf("report %q, want the last line", got)
	}
}

func TestRunCancelStopsEveryRank(t *testing.T) {
	defer goleak.VerifyNone(t)
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(300*time.Millisecond, cancel)
	start := time.Now()
	err := Run(ctx, Options{N: 3, Argv: []string{"sleep", "30"}, Env: func(int) []string { return os.Environ() },
		Stdout: &out, Stderr: &out, Grace: time.Second})
	if !errors.Is(err, context.Canceled) || time.Since(start) > 5*time.Second {
		t.Fatalf("Run = %v after %v, want a prompt context.Canceled", err, time.Since(start))
	}
}

func TestRunLogDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	_, _, err := runSh(t, 2, `echo "hello $RANK"; echo "oops $RANK" >&2`, func(o *Options) { o.LogDir = dir })
	if err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		b, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("rank-%d.log", r)))
		if err != nil {
			t.Fatal(err)
		}
		if got := sortedLines(string(b)); strings.Join(got, "|") != fmt.Sprintf("hello %d|oops %d", r, r) {
			t.Fatalf("rank %d log: %q", r, got)
		}
	}
}

func TestRunRejectsBadOptions(t *testing.T) {
	if _, _, err := runSh(t, 0, "true", nil); err == nil {
		t.Fatal("0 ranks accepted")
	}
	if _, _, err := runSh(t, 1, "", func(o *Options) { o.Argv = nil }); err == nil {
		t.Fatal("empty command accepted")
	}
	_, _, err := runSh(t, 2, "", func(o *Options) { o.Argv = []string{"/nonexistent/program"} })
	if err == nil || !strings.Contains(err.Error(), "start worker [0]") {
		t.Fatalf("missing program: %v", err)
	}
}

func TestPrefixWriterBoundsPartialLines(t *testing.T) {
	var out bytes.Buffer
	p := &prefixWriter{prefix: []byte("[7] "), out: &out}
	p.Write(bytes.Repeat([]byte("x"), maxLine+10))
	if len(p.line) != 0 || !strings.HasPrefix(out.String(), "[7] xxx") {
		t.Fatalf("a long partial line was held: %d bytes buffered", len(p.line))
	}
}

// restarting sets o up for restarts with short backoffs: a restarted
// worker gets RUNNING, the launch indexes running then.
func restarting(dir string, max int) func(*Options) {
	return inDir(dir, func(o *Options) {
		o.MaxRestarts, o.Backoff, o.MaxBackoff = max, 20*time.Millisecond, 30*time.Millisecond
		env := o.Env
		o.RestartEnv = func(i int, running []int) []string {
			return append(env(i), fmt.Sprintf("RUNNING=%v", running))
		}
	})
}

// console is launch's own lines in stderr.
func console(stderr string) string {
	var own []string
	for _, l := range strings.SplitAfter(stderr, "\n") {
		if strings.HasPrefix(l, "gyre launch: ") {
			own = append(own, l)
		}
	}
	return strings.Join(own, "")
}

// starts is a worker's script prologue: it counts its starts in
// $DIR/starts-$RANK, into N.
const starts = `N=$(( $(cat "$DIR/starts-$RANK" 2>/dev/null || echo 0) + 1 )); echo $N > "$DIR/starts-$RANK"; `

// TestRunRestartsAFailedWorker: worker [1] fails at its first three
// starts and finishes at its fourth; with 3 restarts it is started again
// each time, after 20 ms, then 30 ms twice (the backoff doubles up to its
// bound), with the running workers' indexes for its seeds, and the job
// finishes whole. Worker [0] runs until [1] has finished.
func TestRunRestartsAFailedWorker(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	script := starts + `case $RANK in
	0) until [ -e "$DIR/done" ]; do sleep 0.02; done; echo "done 0" ;;
	1) if [ $N -lt 4 ]; then echo "Error: failure $N" >&2; exit 3; fi; echo "start $N running=$RUNNING"; touch "$DIR/done" ;;
	esac`
	out, stderr, err := runSh(t, 2, script, restarting(dir, 3))
	if err != nil {
		t.Fatalf("Run = %v, want the job finished whole\n%s", err, stderr)
	}
	if got := strings.Join(sortedLines(out), "|"); got != "[0] done 0|[1] start 4 running=[0]" {
		t.Fatalf("stdout %q, want [1]'s fourth start, with [0] running, and both done", got)
	}
	want := []string{
		"gyre launch: rank 1 exited with status 3: failure 1; starting it again in 20ms (restart 1 of 3)",
		"gyre launch: rank 1 exited with status 3: failure 2; starting it again in 30ms (restart 2 of 3)",
		"gyre launch: rank 1 exited with status 3: failure 3; starting it again in 30ms (restart 3 of 3)",
	}
	if got := strings.Split(strings.TrimSpace(console(stderr)), "\n"); !slices.Equal(got, want) {
		t.Fatalf("console:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRunGivesUpAfterMaxRestarts: worker [1] always fails; with 1
// restart it is started again once, then given up with its last error,
// and the job finishes without it.
func TestRunGivesUpAfterMaxRestarts(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	// [0] finishes only once [1]'s second process has exited, and launch
	// has had time to take its exit.
	script := starts + `case $RANK in
	0) until [ "$(cat "$DIR/starts-1" 2>/dev/null)" = 2 ] && [ -e "$DIR/pid-1" ]; do sleep 0.02; done
	   while kill -0 "$(cat "$DIR/pid-1")" 2>/dev/null; do sleep 0.02; done; sleep 0.5; echo "done 0" ;;
	1) if [ $N = 2 ]; then echo $$ > "$DIR/pid-1.tmp"; mv "$DIR/pid-1.tmp" "$DIR/pid-1"; fi
	   echo "Error: failure $N" >&2; exit 3 ;;
	esac`
	_, stderr, err := runSh(t, 2, script, restarting(dir, 1))
	var lost *LostError
	if !errors.As(err, &lost) || len(lost.Lost) != 1 || lost.Lost[0].Index != 1 || lost.Lost[0].Code != 3 {
		t.Fatalf("Run = %v, want the job finished without worker [1]", err)
	}
	want := "gyre launch: rank 1 exited with status 3: failure 1; starting it again in 20ms (restart 1 of 1)\n" +
		"gyre launch: rank 1 exited with status 3: failure 2; giving up on it after 1 restart (--max-restarts 1)\n"
	if got := console(stderr); got != want {
		t.Fatalf("console:\n%s\nwant:\n%s", got, want)
	}
}

// TestRunRestartsNoneWhenTheJobEnds: a worker that exits with the
// no-quorum status is not started again (the job is over), nor is one
// that fails after another has finished (the job is ending).
func TestRunRestartsNoneWhenTheJobEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	t.Run("no quorum", func(t *testing.T) {
		_, stderr, err := runSh(t, 2, `if [ $RANK = 1 ]; then exit 75; fi; sleep 30`, restarting(t.TempDir(), 3))
		var re *RankError
		if !errors.As(err, &re) || !re.NoQuorum || console(stderr) != "" {
			t.Fatalf("Run = %v, console %q; want the job ended by [1]'s no quorum, with no restart", err, console(stderr))
		}
	})
	t.Run("finished", func(t *testing.T) {
		// [1] fails once [0] has finished.
		script := `if [ $RANK = 0 ]; then echo $$ > "$DIR/pid-0.tmp"; mv "$DIR/pid-0.tmp" "$DIR/pid-0"; exit 0; fi
		until [ -e "$DIR/pid-0" ]; do sleep 0.02; done
		while kill -0 "$(cat "$DIR/pid-0")" 2>/dev/null; do sleep 0.02; done; sleep 0.5; exit 3`
		_, stderr, err := runSh(t, 2, script, restarting(t.TempDir(), 3))
		var lost *LostError
		if !errors.As(err, &lost) || len(lost.Lost) != 1 || lost.Lost[0].Index != 1 {
			t.Fatalf("Run = %v, want the job finished without worker [1]", err)
		}
		if want := "gyre launch: rank 1 exited with status 3; not starting it again: the job is ending\n"; console(stderr) != want {
			t.Fatalf("console %q, want %q", console(stderr), want)
		}
	})
}

// TestRunGivesEachWorkerItsIndex: {i} in the arguments becomes each
// worker's launch index.
func TestRunGivesEachWorkerItsIndex(t *testing.T) {
	defer goleak.VerifyNone(t)
	out, _, err := runSh(t, 3, `echo "$0 $1"`, func(o *Options) { o.Argv = append(o.Argv, "name-{i}", "file-{i}.json") })
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(sortedLines(out), "|"); got != "[0] name-0 file-0.json|[1] name-1 file-1.json|[2] name-2 file-2.json" {
		t.Fatalf("stdout %q", got)
	}
}

// TestRunNamesACrashThatWasRestarted: a worker that failed and was
// started again is still named in the error of a job that then ends, here
// by another's no quorum.
func TestRunNamesACrashThatWasRestarted(t *testing.T) {
	defer goleak.VerifyNone(t)
	dir := t.TempDir()
	script := starts + `case $RANK in
	0) until [ "$(cat "$DIR/starts-1" 2>/dev/null)" = 2 ]; do sleep 0.02; done; exit 75 ;;
	1) if [ $N = 1 ]; then exit 3; fi; sleep 30 ;;
	esac`
	_, _, err := runSh(t, 2, script, restarting(dir, 1))
	var re *RankError
	if !errors.As(err, &re) || !re.NoQuorum || re.Index != 0 || len(re.Lost) != 1 || re.Lost[0].Index != 1 || re.Lost[0].Code != 3 {
		t.Fatalf("Run = %v, want [0]'s no quorum with [1]'s crash (status 3) lost before", err)
	}
}
