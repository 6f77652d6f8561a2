package recovery

import (
	"fmt"
	"iter"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
)

// longTests reports whether this is CI's GYRE_LONG_TESTS step.
func longTests() bool { return os.Getenv("GYRE_LONG_TESTS") == "1" }

// firstFaults are the faults that start a recovery in the exhaustive
// exploration: each rank's crash (the coordinator-to-be's among them), a
// cut both ways and one way, a partition, and withAbort, an abort (a
// failure that every rank suspects with nobody gone: explored in the
// plain view, where it matters; the other explorations leave it out to
// keep the race-enabled run within its minute). The second fault then
// takes every kind and target, at every message step.
func firstFaults(n int, withAbort bool) []fault {
	var fs []fault
	for a := range n {
		fs = append(fs, fault{kind: crash, a: a})
	}
	fs = append(fs, fault{kind: freeze, a: 0}, fault{kind: cutBoth, a: 0, b: n - 1}, fault{kind: cutOne, a: n - 1, b: 0})
	if withAbort {
		fs = append(fs, fault{kind: abort})
	}
	if n >= 3 {
		fs = append(fs, fault{kind: partition, group: 1<<(n/2) - 1})
	}
	return fs
}

// exploreSteps is how many message steps of a run the second fault is
// tried at in the normal run; the long run tries every step.
const exploreSteps = 20

// setup is the initial state of an exploration: a view with a joiner or
// a leaver, and with boundary, the faults strike during the barrier of
// a boundary that adds the joiner or drops the leaver (see scenario).
type setup struct {
	joiner, leaver, boundary, promote bool
	advanced                          uint
}

func (su setup) scenario(n int, faults []fault, at []int) scenario {
	return scenario{n: n, joiner: su.joiner, leaver: su.leaver, boundary: su.boundary, promote: su.promote,
		advanced: su.advanced, faults: faults, at: at}
}

// explore runs, for n ranks, every first fault alone and then with every
// second fault before each message step of the first one's run (the
// first steps of it unless long). It returns the first violation of each
// run that has one, and how many runs it made. The first faults are
// explored in parallel, one per CPU; each run is deterministic, and the
// results are put together in order. The subtests that call it run in
// parallel too, so that one's last first fault does not leave a CPU idle.
func explore(n int, su setup, steps int, stop bool) (bad []string, runs int) {
	f1s := firstFaults(n, su == setup{})
	type result struct {
		bad  []string
		runs int
	}
	results := make([]result, len(f1s))
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for k, f1 := range f1s {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			res := &results[k]
			base := su.scenario(n, []fault{f1}, []int{0})
			s := newSim(base)
			res.runs++
			if v := s.run(); len(v) > 0 {
				res.bad = append(res.bad, fmt.Sprintf("%v: %s %s", base, v[0].inv, v[0].what))
				if stop {
					return
				}
			}
			last := s.steps + 1
			if steps > 0 {
				last = min(steps, last)
			}
			for step := range last {
				for _, f2 := range allFaults(n) {
					sc := su.scenario(n, []fault{f1, f2}, []int{0, step})
					res.runs++
					if v := newSim(sc).run(); len(v) > 0 {
						res.bad = append(res.bad, fmt.Sprintf("%v: %s %s", sc, v[0].inv, v[0].what))
						if stop {
							return
						}
					}
				}
			}
		}()
	}
	wg.Wait()
	for _, r := range results {
		bad = append(bad, r.bad...)
		runs += r.runs
	}
	return bad, runs
}

func report(t *testing.T, bad []string, runs int) {
	t.Helper()
	for i, b := range bad {
		if i == 5 {
			t.Errorf("… and %d more", len(bad)-5)
			break
		}
		t.Error(b)
	}
	if runs < 10 {
		t.Fatalf("only %d runs", runs)
	}
	t.Logf("%d runs", runs)
}

// stepsLimit is exploreSteps, or 0 (every step) in the long run.
func stepsLimit() int {
	if longTests() {
		return 0
	}
	return exploreSteps
}

// raceRun reports whether this is the normal run under the race
// detector. The simulation is single-threaded: the race detector checks
// only that concurrent runs (explore's fan-out, parallel subtests) share
// nothing, and a few steps per setup reach every statement of the
// package and of the simulator that the normal run reaches. The
// explorations then try the second fault at fewer steps; CI's long run,
// without the race detector, tries every one.
func raceRun() bool { return raceEnabled && !longTests() }

// TestSimulationExhaustive drives 2 to 5 ranks (7 with GYRE_LONG_TESTS=1,
// 4 under the race detector) through one fault, and through two with the
// second one before each message step of the recovery the first one
// started (the first 20 steps; every step if long, up to 5 ranks; under
// the race detector 10, and 2 with 4 ranks), every kind and target.
// I1–I6 must hold in every run. Random schedules cover 8 ranks.
func TestSimulationExhaustive(t *testing.T) {
	maxN := 5
	switch {
	case longTests():
		maxN = 7
	case raceEnabled:
		maxN = 4
	}
	for n := 2; n <= maxN; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			t.Parallel()
			steps := stepsLimit()
			switch {
			case n > 5:
				steps = exploreSteps // every step of 6 or more ranks is too long even for CI
			case raceRun() && n < 4:
				steps = exploreSteps / 2
			case raceRun():
				steps = 2
			}
			bad, runs := explore(n, setup{}, steps, false)
			report(t, bad, runs)
		})
	}
}

// TestSimulationJoinerLeaver is the exhaustive exploration with a view
// whose last rank just joined (it has no state and does not vote), and
// with one whose rank 1 asked to leave, for 3 to 5 ranks: the second
// fault before each of the first 20 message steps with 3 ranks, 10 with
// 4 and 5 with 5 (every step if long). Under the race detector 3 and 4
// ranks, at 5 steps and 1.
func TestSimulationJoinerLeaver(t *testing.T) {
	maxN := 5
	if raceRun() {
		maxN = 4
	}
	for n := 3; n <= maxN; n++ {
		for _, su := range []setup{{joiner: true}, {leaver: true}} {
			t.Run(fmt.Sprintf("%d/joiner=%v", n, su.joiner), func(t *testing.T) {
				t.Parallel()
				steps := stepsLimit()
				switch {
				case raceRun():
					steps = 5 >> (2 * (n - 3)) // 5 with 3 ranks, 1 with 4
				case steps > 0 && n > 3:
					steps = exploreSteps / 2 >> (n - 4) // 10 with 4 ranks, 5 with 5
				}
				bad, runs := explore(n, su, steps, false)
				report(t, bad, runs)
			})
		}
	}
}

// boundarySetups are the boundaries explored for n ranks: one that drops
// the leaver and one that adds the joiner, each with nobody, rank 0 only,
// or every rank but the last past the barrier when the faults strike;
// and one that makes the initial view's joiner a voter, with nobody or
// rank 0 only past it.
func boundarySetups(n int) []setup {
	var out []setup
	for _, su := range []setup{{leaver: true, boundary: true}, {joiner: true, boundary: true}} {
		for _, adv := range []uint{0, 1, 1<<(n-1) - 1} {
			su.advanced = adv
			out = append(out, su)
		}
	}
	// A boundary that only makes the joiner a voter: nobody advanced, and
	// rank 0 alone (the others' recovery counts over the older view).
	for _, adv := range []uint{0, 1} {
		out = append(out, setup{joiner: true, boundary: true, promote: true, advanced: adv})
	}
	return out
}

// TestSimulationBoundary is the exhaustive exploration of a crash (or any
// first fault) during a boundary's barrier: every member decided the
// next view from the table (round 0's accept), some have started running
// in it, the others not yet. 3 to 4 ranks (5 if long); the second fault
// before each of the first 10 message steps (every step if long; under
// the race detector 2 with 3 ranks and 1 with 4).
func TestSimulationBoundary(t *testing.T) {
	maxN := 4
	if longTests() {
		maxN = 5
	}
	for n := 3; n <= maxN; n++ {
		for _, su := range boundarySetups(n) {
			t.Run(fmt.Sprintf("%d/joiner=%v/promote=%v/advanced=%b", n, su.joiner, su.promote, su.advanced), func(t *testing.T) {
				t.Parallel()
				steps := stepsLimit()
				switch {
				case raceRun():
					steps = 5 - n // 2 with 3 ranks, 1 with 4
				case steps > 0:
					steps = exploreSteps / 2
				}
				bad, runs := explore(n, su, steps, false)
				report(t, bad, runs)
			})
		}
	}
}

// randomScenario draws one to three faults at random steps (blips
// among them), with random delivery order, delays and duplicates, and
// sometimes a boundary.
func randomScenario(rng *rand.Rand, n int, maxStep int) scenario {
	fs := append(allFaults(n), blips(n)...)
	sc := scenario{n: n, seed: rng.Uint64() | 1, joiner: rng.IntN(5) == 0, leaver: rng.IntN(5) == 0, resend: rng.IntN(2) == 0}
	if n >= 3 && rng.IntN(4) == 0 {
		sc.boundary = true
		if !sc.joiner && !sc.leaver {
			sc.joiner = rng.IntN(2) == 0
			sc.leaver = !sc.joiner
		}
		sc.advanced = uint(rng.IntN(1 << n))
	}
	for range 1 + rng.IntN(3) {
		sc.faults = append(sc.faults, fs[rng.IntN(len(fs))])
		sc.at = append(sc.at, rng.IntN(maxStep))
	}
	sc.at[0] = 0
	return sc
}

// TestSimulationRandom runs random schedules: random delivery order,
// delays of 1 to 3 ticks and duplicates, one to three faults at random
// steps. Up to 5 ranks here (the first 300 of these schedules under the
// race detector); with GYRE_LONG_TESTS=1, up to 8 and many more runs,
// with faults later. The schedules are drawn in order and run on every
// CPU; the first one that fails is reported.
func TestSimulationRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 1))
	maxN, runs, maxStep := 5, 1500, 60
	switch {
	case longTests():
		maxN, runs, maxStep = 8, 20000, 150
	case raceEnabled:
		runs = 300
	}
	scs := make([]scenario, runs)
	for i := range scs {
		scs[i] = randomScenario(rng, 2+rng.IntN(maxN-1), maxStep)
	}
	bad := make([][]violation, runs)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < runs; i = int(next.Add(1) - 1) {
				bad[i] = newSim(scs[i]).run()
			}
		})
	}
	wg.Wait()
	for i, v := range bad {
		if len(v) > 0 {
			t.Fatalf("%v: %s %s", scs[i], v[0].inv, v[0].what)
		}
	}
}

// TestSimulationFound replays schedules that the long runs once found
// failing, so that the normal run keeps them fixed.
func TestSimulationFound(t *testing.T) {
	for _, sc := range []scenario{
		// Three of the six ranks on the majority side had accepted an
		// epoch-2 view that was never installed, and picked each round's
		// coordinator from it; the other three picked from the installed
		// view. Every round then had two coordinators, neither with a
		// majority, for ever (I5). Coordinators now come from the
		// installed view.
		{n: 8, seed: 1903927052105943273, faults: []fault{{kind: cutOne, a: 3, b: 5}, {kind: partition, group: 0b1001}}, at: []int{0, 20}},
	} {
		if v := newSim(sc).run(); len(v) > 0 {
			t.Errorf("%v: %s %s", sc, v[0].inv, v[0].what)
		}
	}
}

// majorityFrozen yields the schedules in which a majority of 3 to 7
// ranks, any consecutive ranks, freeze at once and resume together, with
// resends on and off: the others cannot recover meanwhile, and once the
// frozen resume, the others' evidence that they are back lags, unequally
// (heardLag). Minimal exclusion (I7) must keep every rank no fault
// struck.
func majorityFrozen() iter.Seq[scenario] {
	return func(yield func(scenario) bool) {
		for n := 3; n <= 7; n++ {
			k := n/2 + 1
			for first := 0; first+k <= n; first++ {
				var sc scenario
				for a := first; a < first+k; a++ {
					sc.faults = append(sc.faults, fault{kind: freeze, a: a})
					sc.at = append(sc.at, 0)
				}
				for _, resend := range []bool{false, true} {
					sc.n, sc.resend = n, resend
					if !yield(sc) {
						return
					}
				}
			}
		}
	}
}

// TestSimulationMajorityFrozen runs majorityFrozen's schedules.
func TestSimulationMajorityFrozen(t *testing.T) {
	for sc := range majorityFrozen() {
		for _, v := range newSim(sc).run() {
			t.Errorf("%v: %s %s", sc, v.inv, v.what)
		}
	}
}
