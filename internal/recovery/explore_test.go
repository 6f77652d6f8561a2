package recovery

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

// longTests reports whether this is CI's GYRE_LONG_TESTS step.
func longTests() bool { return os.Getenv("GYRE_LONG_TESTS") == "1" }

// firstFaults are the faults that start a recovery in the exhaustive
// exploration: each rank's crash (the coordinator-to-be's among them), a
// cut both ways and one way, and a partition. The second fault then
// takes every kind and target, at every message step.
func firstFaults(n int) []fault {
	var fs []fault
	for a := range n {
		fs = append(fs, fault{kind: crash, a: a})
	}
	fs = append(fs, fault{kind: freeze, a: 0}, fault{kind: cutBoth, a: 0, b: n - 1}, fault{kind: cutOne, a: n - 1, b: 0})
	if n >= 3 {
		fs = append(fs, fault{kind: partition, group: 1<<(n/2) - 1})
	}
	return fs
}

// exploreSteps is how many message steps of a run the second fault is
// tried at.
const exploreSteps = 20

// explore runs, for n ranks, every first fault alone and then with every
// second fault before each of the first exploreSteps message steps. It
// returns the first violation of each run that has one, and how many runs
// it made.
func explore(n int, joiner, leaver bool, stop bool) (bad []string, runs int) {
	for _, f1 := range firstFaults(n) {
		base := scenario{n: n, joiner: joiner, leaver: leaver, faults: []fault{f1}, at: []int{0}}
		s := newSim(base)
		runs++
		if v := s.run(); len(v) > 0 {
			bad = append(bad, fmt.Sprintf("%v: %s %s", base, v[0].inv, v[0].what))
			if stop {
				return bad, runs
			}
		}
		for step := range min(exploreSteps, s.steps+1) {
			for _, f2 := range allFaults(n) {
				sc := scenario{n: n, joiner: joiner, leaver: leaver, faults: []fault{f1, f2}, at: []int{0, step}}
				runs++
				if v := newSim(sc).run(); len(v) > 0 {
					bad = append(bad, fmt.Sprintf("%v: %s %s", sc, v[0].inv, v[0].what))
					if stop {
						return bad, runs
					}
				}
			}
		}
	}
	return bad, runs
}

// TestSimulationExhaustive drives 2 to 5 ranks (8 with GYRE_LONG_TESTS=1)
// through one fault, and through two with the second one before each
// message step of the recovery the first one started, every kind and
// target. I1–I6 must hold in every run.
func TestSimulationExhaustive(t *testing.T) {
	maxN := 5
	if longTests() {
		maxN = 8
	}
	for n := 2; n <= maxN; n++ {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			bad, runs := explore(n, false, false, false)
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
		})
	}
}

// TestSimulationJoinerLeaver is the exhaustive exploration with a view
// whose last rank just joined (it has no state and does not vote), and
// with one whose rank 1 asked to leave.
func TestSimulationJoinerLeaver(t *testing.T) {
	for _, n := range []int{3} {
		for _, jl := range [][2]bool{{true, false}, {false, true}} {
			t.Run(fmt.Sprintf("%d/joiner=%v", n, jl[0]), func(t *testing.T) {
				bad, _ := explore(n, jl[0], jl[1], false)
				for i, b := range bad {
					if i == 5 {
						t.Errorf("… and %d more", len(bad)-5)
						break
					}
					t.Error(b)
				}
			})
		}
	}
}

// randomScenario draws one or two faults at random steps, with random
// delivery order and delays.
func randomScenario(rng *rand.Rand, n int) scenario {
	fs := allFaults(n)
	sc := scenario{n: n, seed: rng.Uint64() | 1, joiner: rng.IntN(5) == 0, leaver: rng.IntN(5) == 0}
	for range 1 + rng.IntN(2) {
		sc.faults = append(sc.faults, fs[rng.IntN(len(fs))])
		sc.at = append(sc.at, rng.IntN(60))
	}
	sc.at[0] = 0
	return sc
}

// TestSimulationRandom runs random schedules: random delivery order and
// delays of 1 to 3 ticks, one or two faults at random steps. Up to 5
// ranks here; with GYRE_LONG_TESTS=1, up to 8 and many more runs.
func TestSimulationRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 1))
	maxN, runs := 5, 1500
	if longTests() {
		maxN, runs = 8, 20000
	}
	for range runs {
		sc := randomScenario(rng, 2+rng.IntN(maxN-1))
		if v := newSim(sc).run(); len(v) > 0 {
			t.Fatalf("%v: %s %s", sc, v[0].inv, v[0].what)
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
