package recovery

import (
	"iter"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestMutations switches off one rule at a time and checks that the
// simulator then finds a violation of the invariant the rule protects.
// The search stops once it found every one it wants: of the 1,760
// schedules per rule, the wanted violations come within the first 262.
func TestMutations(t *testing.T) {
	for _, tc := range []struct {
		name string
		on   func(bool)
		want []string // the invariants that must fail
	}{
		{"no majority check", func(b bool) { mutate.noMajority = b }, []string{"I1", "I6"}},
		{"install on proposal", func(b bool) { mutate.installOnPropose = b }, []string{"I1", "I6"}},
		{"adopt the coordinator's commit", func(b bool) { mutate.adoptCoordinatorCommit = b }, []string{"I4"}},
		{"ignore a view accepted for the next epoch", func(b bool) { mutate.ignorePrior = b }, []string{"I1"}},
		{"drop by unreachable peers only", func(b bool) { mutate.greedyIgnoresHearing = b }, []string{"I7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.on(true)
			defer tc.on(false)
			found := map[string]string{}
			runs := 0
			for sc := range mutationSchedules() {
				runs++
				for _, v := range newSim(sc).run() {
					if found[v.inv] == "" {
						found[v.inv] = sc.String() + ": " + v.what
					}
				}
				if !slices.ContainsFunc(tc.want, func(w string) bool { return found[w] == "" }) {
					break
				}
			}
			for _, w := range tc.want {
				if found[w] == "" {
					t.Errorf("no %s violation found in %d schedules; found %v", w, runs, found)
				}
			}
			var invs []string
			for k := range found {
				invs = append(invs, k)
			}
			slices.Sort(invs)
			for _, w := range tc.want {
				t.Logf("%d schedules; violations: %v; %s: %s", runs, invs, w, found[w])
			}
		})
	}
}

// mutationSchedules are the schedules TestMutations tries, in order:
// every first and second fault at steps 0, 3, 6 and 9 with 3 and 4 ranks,
// then 200 random ones.
func mutationSchedules() iter.Seq[scenario] {
	return func(yield func(scenario) bool) {
		for n := 3; n <= 4; n++ {
			for _, f1 := range firstFaults(n, false) {
				for _, f2 := range allFaults(n) {
					for _, step := range []int{0, 3, 6, 9} {
						if !yield(scenario{n: n, faults: []fault{f1, f2}, at: []int{0, step}}) {
							return
						}
					}
				}
			}
		}
		rng := rand.New(rand.NewPCG(5, 6))
		for range 200 {
			if !yield(randomScenario(rng, 2+rng.IntN(4), 60)) {
				return
			}
		}
		for sc := range majorityFrozen() {
			if !yield(sc) {
				return
			}
		}
	}
}

// TestMajorityWindow: without the majority check, the side of a 2-2
// partition installs a view though no majority of the old view was ever
// alive and connected after the fault; the window check of I6 (not only
// the count of acceptors) must say so.
func TestMajorityWindow(t *testing.T) {
	mutate.noMajority = true
	defer func() { mutate.noMajority = false }()
	for _, f2 := range allFaults(4) {
		sc := scenario{n: 4, faults: []fault{{kind: partition, group: 0b11}, f2}, at: []int{0, 0}}
		for _, v := range newSim(sc).run() {
			if v.inv == "I6" && strings.Contains(v.what, "alive and connected since") {
				return
			}
		}
	}
	t.Fatal("no I6 violation of the majority window")
}
