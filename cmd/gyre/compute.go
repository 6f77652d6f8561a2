package main

import (
	"fmt"
	"strconv"

	"github.com/gyre-ml/gyre/internal/mlp"
)

// computeProcs is the --compute-procs flag: how many goroutines the
// model's matrix products run on. "all" (0) leaves gonum to use every
// GOMAXPROCS; "auto" keeps one for the transport (mlp.ComputeProcs); a
// number bounds them.
type computeProcs struct {
	auto bool
	n    int
}

func (p *computeProcs) String() string {
	switch {
	case p.auto:
		return "auto"
	case p.n == 0:
		return "all"
	}
	return strconv.Itoa(p.n)
}

func (p *computeProcs) Set(s string) error {
	switch s {
	case "auto":
		*p = computeProcs{auto: true}
		return nil
	case "all":
		*p = computeProcs{}
		return nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return fmt.Errorf("want auto, all or a positive number of goroutines, not %q", s)
	}
	*p = computeProcs{n: n}
	return nil
}

func (p *computeProcs) Type() string { return "auto|all|N" }

// procs is the bound for mlp.Model.SetProcs: 0 for all of GOMAXPROCS.
func (p *computeProcs) procs() int {
	if p.auto {
		return mlp.ComputeProcs()
	}
	return p.n
}

const computeProcsUsage = "goroutines the model's matrix products run on: all (every GOMAXPROCS, gonum's own), " +
	"auto (GOMAXPROCS-1, at least 1, leaving CPU to the transport) or N"
