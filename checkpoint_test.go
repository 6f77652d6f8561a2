package gyre_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
	"github.com/gyre-ml/gyre/internal/checkpoint"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// checkpointJob trains a toy on n workers for iters iterations with a
// checkpoint every 10, each worker into dirOf(rank), and returns the
// committed θ of every iteration, as rank 0 saw it, and for each rank the
// checkpoints its log says it wrote.
func checkpointJob(t *testing.T, n int, iters int64, dirOf func(r int) string, keep int) (map[int64][]float64, [][]string) {
	t.Helper()
	models := make([]*toy, n)
	logs := make([]*transporttest.LogBuffer, n)
	c := gyretest.MakeCluster(t, gyretest.Options{N: n,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.CheckpointDir, cfg.CheckpointEvery, cfg.CheckpointKeep = 24, dirOf(r), 10, keep
			logs[r] = &transporttest.LogBuffer{}
			l := zerolog.New(logs[r]).Level(zerolog.InfoLevel)
			cfg.Logger = &l
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	thetas := map[int64][]float64{}
	errs := c.Run(func(r int, w *gyre.Worker) error {
		for w.Iter() < iters {
			if err := trainStep(ctx, w, models[r]); err != nil {
				return err
			}
			if r == 0 {
				thetas[w.Iter()] = slices.Clone(models[r].theta)
			}
		}
		return w.Leave(ctx)
	})
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	wrote := make([][]string, n)
	for r, l := range logs {
		for _, line := range strings.Split(l.String(), "\n") {
			var e struct{ Message, File string }
			if json.Unmarshal([]byte(line), &e) == nil && e.Message == "checkpoint written" {
				wrote[r] = append(wrote[r], e.File)
			}
		}
	}
	return thetas, wrote
}

// TestCheckpointsWritten: with a directory per worker, every worker
// writes its checkpoints; with one directory for all, only rank 0 does.
// Either way each file holds the committed state of its iteration, with
// mode 0600; a checkpoint falls at each multiple of 10, or at the first
// commit after it at which the writer is free, and the one due at the
// job's end is written by Leave; the directory keeps the newest
// --checkpoint-keep.
func TestCheckpointsWritten(t *testing.T) {
	check := func(t *testing.T, dir string, thetas map[int64][]float64, keep int) {
		t.Helper()
		d := checkpoint.Dir{Path: dir}
		infos, err := d.List()
		if err != nil {
			t.Fatal(err)
		}
		var iters []int64
		for _, in := range infos {
			iters = append(iters, in.Iter)
			s, err := d.Load(in.Name)
			if err != nil {
				t.Fatal(err)
			}
			if s.Workers != 3 || s.Entries[0].Name != "theta" || !slices.Equal(s.Values[0].F64, thetas[in.Iter]) {
				t.Errorf("%s: %d workers, entries %v, θ %v; want 3, theta first, θ %v", in.Name, s.Workers, s.Entries, s.Values[0].F64, thetas[in.Iter])
			}
			st, _ := os.Stat(filepath.Join(dir, in.Name))
			if st.Mode().Perm() != 0o600 {
				t.Errorf("%s has mode %v, want 0600", in.Name, st.Mode().Perm())
			}
		}
		// Newest first: one per decade, the newest in the last one.
		if len(iters) == 0 || iters[0] < 40 || keep > 0 && len(iters) > keep {
			t.Errorf("%s holds checkpoints of iterations %v; want the newest at 40 or later, at most %d", dir, iters, keep)
		}
		for i := 1; i < len(iters); i++ {
			if iters[i]/10 >= iters[i-1]/10 {
				t.Errorf("%s holds checkpoints of iterations %v: two in one decade", dir, iters)
			}
		}
	}
	t.Run("per-worker", func(t *testing.T) {
		root := t.TempDir()
		dirOf := func(r int) string { return filepath.Join(root, string(rune('a'+r))) }
		thetas, wrote := checkpointJob(t, 3, 45, dirOf, 2)
		for r := range 3 {
			check(t, dirOf(r), thetas, 2)
			if len(wrote[r]) == 0 {
				t.Errorf("rank %d logged no checkpoint written", r)
			}
		}
	})
	t.Run("shared", func(t *testing.T) {
		dir := t.TempDir()
		thetas, wrote := checkpointJob(t, 3, 45, func(int) string { return dir }, 100)
		check(t, dir, thetas, 100)
		if infos, _ := (checkpoint.Dir{Path: dir}).List(); len(wrote[0]) != len(infos) || len(wrote[1])+len(wrote[2]) > 0 {
			t.Errorf("in a shared directory ranks 0, 1 and 2 wrote %v, %v and %v; want rank 0 alone, each of the %d files", wrote[0], wrote[1], wrote[2], len(infos))
		}
		ents, _ := os.ReadDir(dir)
		markers := 0
		for _, e := range ents {
			if filepath.Ext(e.Name()) == ".marker" {
				markers++
			}
		}
		if markers != 3 {
			t.Errorf("the shared directory holds %d markers, want one per worker: %v", markers, ents)
		}
	})
}

// resumeRun is one run of a job that checkpoints every 10 iterations,
// each worker into dirOf(rank) with batch 24 unless cfg changes it.
type resumeRun struct {
	n       int
	dirOf   func(r int) string
	iters   int64 // train up to this iteration
	crash   bool  // then close every worker without Leave, as a crash would
	cfg     func(r int, c *gyre.Config)
	extra   bool // register a tensor more than the toy's
	log     *transporttest.LogBuffer
	resumed []gyre.Resumed // what each worker's Join resumed from
	models  []*toy
}

// run joins the job, which resumes from the newest checkpoint its
// workers hold, and trains it. Each checkpoint is on disk before the next
// iteration, so that which ones exist does not depend on the disk.
func (j *resumeRun) run(t *testing.T) error {
	t.Helper()
	j.models, j.resumed, j.log = make([]*toy, j.n), make([]gyre.Resumed, j.n), &transporttest.LogBuffer{}
	c := gyretest.Start(t, gyretest.Options{N: j.n,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.CheckpointDir, cfg.CheckpointEvery = 24, j.dirOf(r), 10
			l := zerolog.New(j.log).Level(zerolog.InfoLevel)
			cfg.Logger = &l
			if j.cfg != nil {
				j.cfg(r, cfg)
			}
		},
		State: func(r int) *gyre.State {
			j.models[r] = newToy()
			if j.extra {
				return j.models[r].state().Float32("extra", make([]float32, 3))
			}
			return j.models[r].state()
		}})
	if err := errors.Join(c.Errs...); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return errors.Join(c.Run(func(r int, w *gyre.Worker) error {
		j.resumed[r], _ = w.Resumed()
		for w.Iter() < j.iters {
			if err := trainStep(ctx, w, j.models[r]); err != nil {
				return err
			}
			gyre.WaitCheckpoint(w)
		}
		if j.crash {
			return w.Close()
		}
		return w.Leave(ctx)
	})...)
}

// TestResumeAtAnyWorkerCount: a job of 3 crashes at iteration 35. Started
// again with 2 workers (the directories of ranks 0 and 1) it resumes from
// iteration 30 and ends where one process ends; started again with 4 (a
// new one with an empty directory) it resumes from the 2 workers' newest,
// at a higher epoch, and again ends where one process ends.
func TestResumeAtAnyWorkerCount(t *testing.T) {
	root := t.TempDir()
	dirOf := func(r int) string { return filepath.Join(root, string(rune('a'+r))) }
	first := &resumeRun{n: 3, dirOf: dirOf, iters: 35, crash: true}
	if err := first.run(t); err != nil {
		t.Fatal(err)
	}
	for r, res := range first.resumed {
		if res.File != "" {
			t.Fatalf("rank %d of the first run resumed from %+v, with no checkpoint anywhere", r, res)
		}
	}
	two := &resumeRun{n: 2, dirOf: dirOf, iters: 60, crash: true}
	if err := two.run(t); err != nil {
		t.Fatal(err)
	}
	for r, res := range two.resumed {
		if res.Iter != 30 || res.File == "" {
			t.Fatalf("rank %d of 2 resumed from %+v; want iteration 30", r, res)
		}
	}
	if want := referenceToy(t, 24, 60); !closeRel(two.models[0].theta, want.theta, 1e-12) || !closeRel(two.models[1].theta, want.theta, 1e-12) {
		t.Fatalf("resumed on 2 workers, θ[0] = %v and %v; one process %v", two.models[0].theta[0], two.models[1].theta[0], want.theta[0])
	}
	four := &resumeRun{n: 4, dirOf: dirOf, iters: 80}
	if err := four.run(t); err != nil {
		t.Fatal(err)
	}
	for r, res := range four.resumed {
		if res.Iter != 60 || res.Epoch <= two.resumed[0].Epoch {
			t.Fatalf("rank %d of 4 resumed from %+v; want iteration 60, at an epoch past %d", r, res, two.resumed[0].Epoch)
		}
	}
	want := referenceToy(t, 24, 80)
	for r, m := range four.models {
		if !closeRel(m.theta, want.theta, 1e-12) {
			t.Fatalf("resumed on 4 workers, rank %d's θ[0] = %v; one process %v", r, m.theta[0], want.theta[0])
		}
	}
	if !strings.Contains(four.log.String(), "resumed from a checkpoint") {
		t.Error("no worker logged that it resumed")
	}
}

// TestResumeSkipsDamagedCheckpoint: the newest checkpoint of a shared
// directory is truncated: the job resumes from the one before, and logs
// the damaged file by name.
func TestResumeSkipsDamagedCheckpoint(t *testing.T) {
	dir := t.TempDir()
	same := func(int) string { return dir }
	if err := (&resumeRun{n: 2, dirOf: same, iters: 35, crash: true}).run(t); err != nil {
		t.Fatal(err)
	}
	infos, err := (checkpoint.Dir{Path: dir}).List()
	if err != nil || len(infos) != 3 || infos[0].Iter != 30 {
		t.Fatalf("the first run left %v, %v; want 30, 20 and 10", infos, err)
	}
	newest := filepath.Join(dir, infos[0].Name)
	if err := os.Truncate(newest, 100); err != nil {
		t.Fatal(err)
	}
	again := &resumeRun{n: 2, dirOf: same, iters: 40}
	if err := again.run(t); err != nil {
		t.Fatal(err)
	}
	if again.resumed[0].Iter != 20 || again.resumed[1].Iter != 20 {
		t.Fatalf("resumed from %+v; want iteration 20", again.resumed)
	}
	if !strings.Contains(again.log.String(), newest) {
		t.Fatalf("no log line names the damaged file %s:\n%s", newest, again.log)
	}
	if want := referenceToy(t, 24, 40); !closeRel(again.models[0].theta, want.theta, 1e-12) {
		t.Fatalf("θ[0] = %v, one process %v", again.models[0].theta[0], want.theta[0])
	}
}

// TestResumeRefusesAMisfit: a job started again with another global
// batch, or with a tensor more, refuses the checkpoint on every worker,
// naming the difference.
func TestResumeRefusesAMisfit(t *testing.T) {
	dir := t.TempDir()
	same := func(int) string { return dir }
	if err := (&resumeRun{n: 2, dirOf: same, iters: 15, crash: true}).run(t); err != nil {
		t.Fatal(err)
	}
	err := (&resumeRun{n: 2, dirOf: same, iters: 20, cfg: func(r int, c *gyre.Config) { c.GlobalBatch = 32 }}).run(t)
	if !errors.Is(err, gyre.ErrDiverged) || !strings.Contains(err.Error(), "GlobalBatch") || !strings.Contains(err.Error(), checkpoint.FileName(1, 10)) {
		t.Fatalf("resuming with --batch 32 from a checkpoint of batch 24: %v; want ErrDiverged naming GlobalBatch and the file", err)
	}
	err = (&resumeRun{n: 2, dirOf: same, iters: 20, extra: true}).run(t)
	if !errors.Is(err, gyre.ErrDiverged) || !strings.Contains(err.Error(), "holds 3 entries, this worker registered 4") {
		t.Fatalf("resuming with a tensor more: %v; want ErrDiverged saying the entries differ", err)
	}
}

// TestCheckpointDiskFaults: a worker whose checkpoint directory vanishes
// mid-run logs one error line per checkpoint it could not write, and
// trains on to the end; with CheckpointRequired, the next Boundary
// returns the failure (ErrCheckpoint, naming the file) instead.
func TestCheckpointDiskFaults(t *testing.T) {
	for _, required := range []bool{false, true} {
		t.Run(map[bool]string{false: "logged", true: "required"}[required], func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "ckpt")
			log := &transporttest.LogBuffer{}
			m := newToy()
			c := gyretest.MakeCluster(t, gyretest.Options{N: 1,
				Config: func(r int, cfg *gyre.Config) {
					cfg.GlobalBatch, cfg.CheckpointDir, cfg.CheckpointEvery, cfg.CheckpointRequired = 24, dir, 10, required
					l := zerolog.New(log).Level(zerolog.InfoLevel)
					cfg.Logger = &l
				},
				State: func(int) *gyre.State { return m.state() }})
			w := c.Workers[0]
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var err error
			for w.Iter() < 45 && err == nil {
				if w.Iter() == 15 {
					if err := os.RemoveAll(dir); err != nil {
						t.Fatal(err)
					}
				}
				err = trainStep(ctx, w, m)
				gyre.WaitCheckpoint(w) // each checkpoint is tried at its iteration
			}
			failed := strings.Count(log.String(), "checkpoint not written")
			if !required {
				if err != nil || w.Iter() != 45 || failed != 3 {
					t.Fatalf("ended at iteration %d with %v, %d error lines; want 45, no error, one line each for 20, 30 and 40:\n%s", w.Iter(), err, failed, log)
				}
				return
			}
			if !errors.Is(err, gyre.ErrCheckpoint) || !strings.Contains(err.Error(), checkpoint.FileName(1, 20)) || w.Iter() != 20 || failed != 1 {
				t.Fatalf("required: ended at iteration %d with %v, %d error lines; want ErrCheckpoint naming %s from the boundary of 20, one line:\n%s",
					w.Iter(), err, failed, checkpoint.FileName(1, 20), log)
			}
		})
	}
}

// TestRequiredCheckpointEndsTheJob: in a job of 3 sharing one directory,
// rank 0 writes; when its write fails with --checkpoint-required, every
// worker's next Boundary returns ErrCheckpoint, the others' naming rank
// 0, so the whole job ends instead of going on without checkpoints.
func TestRequiredCheckpointEndsTheJob(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ckpt")
	models := make([]*toy, 3)
	c := gyretest.MakeCluster(t, gyretest.Options{N: 3,
		Config: func(r int, cfg *gyre.Config) {
			cfg.GlobalBatch, cfg.CheckpointDir, cfg.CheckpointEvery, cfg.CheckpointRequired = 24, dir, 10, true
		},
		State: func(r int) *gyre.State {
			models[r] = newToy()
			return models[r].state()
		}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := c.Run(func(r int, w *gyre.Worker) error {
		for w.Iter() < 45 {
			if w.Iter() == 15 && r == 0 {
				if err := os.RemoveAll(dir); err != nil {
					return err
				}
			}
			if err := trainStep(ctx, w, models[r]); err != nil {
				return err
			}
			gyre.WaitCheckpoint(w)
		}
		return nil
	})
	for r, err := range errs {
		if !errors.Is(err, gyre.ErrCheckpoint) || r > 0 && !strings.Contains(err.Error(), "rank 0") {
			t.Errorf("rank %d: %v; want ErrCheckpoint (naming rank 0 on the others)", r, err)
		}
	}
}
