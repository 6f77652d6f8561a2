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
