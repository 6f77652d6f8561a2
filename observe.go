package gyre

import (
	"github.com/gyre-ml/gyre/internal/obs"
	"github.com/gyre-ml/gyre/ring"
)

// Observer is told what the runtime does, as it happens: every collective
// on the data channel (Worker.Comm and the fusers, with its operation,
// algorithm, bytes, duration and error) and every iteration boundary
// (BoundaryStats). Set one in Config.Observer; Config.MetricsAddr installs
// the Prometheus one beside it. Its methods run on the runtime's
// goroutines and must be quick; Collective must not block or allocate.
//
// An Observer may also have any of these methods, each called when it
// applies:
//
//	Span(kind string, iter int64, start, end time.Time) // the trainer's spans (StartSpan) and the runtime's own
//	Bucket(BucketStats)                                  // every gradient bucket, with its tensors and phases
//	Stall(StallReport)                                   // every stall report (Config.StallThreshold)
type Observer = obs.Observer

// BoundaryStats describes one iteration boundary, for Observer.Boundary.
type BoundaryStats = obs.Boundary

// CollectiveStats describes one collective, for Observer.Collective.
type CollectiveStats = ring.CollectiveStats

// BucketStats describes one gradient bucket: its tensors' names and the
// times of its phases, for an Observer's Bucket method.
type BucketStats = ring.BucketStats

// StallReport is one stall report, for an Observer's Stall method: the
// collective this worker waited in past Config.StallThreshold, the ranks
// that had not reached it and the tensors pending.
type StallReport = obs.Stall

// MetricsAddr returns the address the worker serves its Prometheus
// metrics on (Config.MetricsAddr, with the port chosen if it was 0), or ""
// if it serves none.
func (w *Worker) MetricsAddr() string { return w.e.MetricsAddr() }
