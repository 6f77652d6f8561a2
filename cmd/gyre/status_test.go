package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/membership"
)

// worker is a live worker's gossip entry for jobStatuses.
func worker(name, job, lead string, epoch uint64, rank int32, commit int64, st membership.Status) membership.Member {
	return membership.Member{Name: name, Addr: name + "-gossip", State: membership.Alive,
		Meta: membership.Meta{Role: membership.RoleWorker, Job: job, Lead: lead, Epoch: epoch, Rank: rank, Commit: commit, Status: st, Started: epoch > 0}}
}

// TestJobStatuses: the members' metadata make one status per job: the
// view whose members publish the newest commit, with the job's figures
// from rank 0, pending and gone members apart, and warnings for a second
// view of the job and for members still at an older epoch.
func TestJobStatuses(t *testing.T) {
	st := func(share int32, loss float32) membership.Status {
		return membership.Status{Share: share, Global: 256, Rate: 100, JobRate: 300, Loss: loss, HasLoss: true}
	}
	gone := worker("d", "a", "x", 4, 2, 90, membership.Status{})
	gone.State = membership.Dead
	ms := []membership.Member{
		worker("w1", "a", "x", 5, 1, 120, st(128, 0.5)),
		worker("w0", "a", "x", 5, 0, 120, st(128, 0.25)),
		worker("w2", "a", "x", 4, 2, 110, st(0, 0)), // still at the old epoch
		worker("p", "a", "", 0, -1, 0, membership.Status{}),
		gone,
		worker("v0", "a", "y", 7, 0, 40, st(256, 1)), // a second view, behind
		worker("b0", "b", "b0", 1, 0, 0, membership.Status{}),
		{Name: "obs", State: membership.Alive, Meta: membership.Meta{Role: membership.RoleObserver, Rank: -1}},
	}
	jobs := jobStatuses(ms)
	if len(jobs) != 2 || jobs[0].Job != "a" || jobs[1].Job != "b" {
		t.Fatalf("jobs %+v, want a and b", jobs)
	}
	a := jobs[0]
	if a.Epoch != 5 || a.Iteration != 120 || a.GlobalBatch != 256 || a.SamplesPerSec != 300 || a.Loss == nil || *a.Loss != 0.25 {
		t.Fatalf("job a: %+v", a)
	}
	if len(a.Ranks) != 3 || a.Ranks[0].ID != "w0" || a.Ranks[1].ID != "w1" || a.Ranks[2].ID != "w2" || a.Ranks[1].Share != 128 {
		t.Fatalf("job a's ranks: %+v", a.Ranks)
	}
	if len(a.Pending) != 1 || a.Pending[0].ID != "p" || len(a.Gone) != 1 || a.Gone[0].ID != "d" {
		t.Fatalf("job a's pending %+v and gone %+v", a.Pending, a.Gone)
	}
	if len(a.Warnings) != 2 || !strings.Contains(a.Warnings[0], "another view of job \"a\": workers 1 at epoch 7, iteration 40 (lead y)") ||
		!strings.Contains(a.Warnings[1], "the view is changing: rank 2 w2 at epoch 4, the others at 5") {
		t.Fatalf("job a's warnings: %q", a.Warnings)
	}
	if b := jobs[1]; len(b.Ranks) != 1 || b.GlobalBatch != 0 || b.Loss != nil {
		t.Fatalf("job b, not yet published: %+v", b)
	}
	var out bytes.Buffer
	if err := writeJobStatuses(&out, jobs); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(strings.Fields(strings.ReplaceAll(out.String(), "\n", " | ")), " ")
	for _, want := range []string{"| a 5 120 3 1 256 300 0.25 |", "| 1 w1 alive 128 100 0.5 - |", "| pending: p (gossip p-gossip)",
		"| out of the view: d (gossip d-gossip), dead |", "| warning: gossip shows another view", "| b 1 0 1 0 - - - |"} {
		if !strings.Contains(text, want) {
			t.Errorf("the tables lack %q:\n%s", want, out.String())
		}
	}
}
