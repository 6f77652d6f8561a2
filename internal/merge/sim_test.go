package merge

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The simulator runs 2 or 3 started views of one job that meet in one
// gossip cluster. Time goes in ticks. At each tick every member's
// picture of every other view may catch up with what that view published
// (monotonically, by any amount: gossip's delays), a member may crash
// (the view's lead changes when its smallest member goes), and each
// started view may run a boundary: it commits one more iteration, each
// member judges from its own picture, the view agrees on the lowest
// rank's verdict and acts on it, then publishes. After the faults end,
// pictures are current at every tick, and the views must have merged.

// pub is what a view's members publish in gossip.
type pub struct {
	started bool
	lead    string
	commit  int64
	tick    int // when it was published
}

type simView struct {
	members []string // alive, sorted: members[0] is the lead
	commit  int64
	rate    float64 // chance of a boundary per tick
	lastPub int     // the tick of the last publication
	own     Own
	started bool
	history []pub // every version published, oldest first
	// seen[m][k] is the version of view k's history member m sees.
	seen [][]int
	// yieldedTo is the view it yielded to (-1: none), at tick yieldedAt
	// and rank key (the published iteration and lead it compared).
	yieldedTo int
	yieldedAt int
	key       Sight
}

type scenario struct {
	seed    uint64
	views   int
	members []int
	commits []int64
	rates   []float64
	catchUp float64 // chance per tick that a picture catches up
	crash   float64 // chance per tick of a crash
	faulty  int     // ticks with faults
	lag     int     // after them, how old a picture is, in ticks
}

// publishEvery is how often a view publishes its committed iteration, in
// ticks: far more than gossip's delay once it is current (scenario.lag),
// as the runtime publishes every few seconds.
const publishEvery = 10

func (sc scenario) String() string {
	return fmt.Sprintf("seed %d: %d views, members %v, commits %v, rates %.2f, catch-up %.2f, crash %.3f, lag %d",
		sc.seed, sc.views, sc.members, sc.commits, sc.rates, sc.catchUp, sc.crash, sc.lag)
}

func randomScenario(seed uint64) scenario {
	rng := rand.New(rand.NewPCG(seed, 7))
	sc := scenario{seed: seed, views: 2 + rng.IntN(2), catchUp: 0.05 + 0.9*rng.Float64(), faulty: 20 + rng.IntN(200),
		lag: rng.IntN(publishEvery / 2)}
	if rng.IntN(3) == 0 {
		sc.crash = 0.02 * rng.Float64()
	}
	lockstep := rng.IntN(3) == 0 // views as fast as each other, from one iteration
	commit := int64(rng.IntN(40))
	for range sc.views {
		sc.members = append(sc.members, 1+rng.IntN(3))
		if lockstep {
			sc.commits, sc.rates = append(sc.commits, commit), append(sc.rates, 1)
			continue
		}
		sc.commits = append(sc.commits, int64(rng.IntN(40)))
		sc.rates = append(sc.rates, 0.2+0.8*rng.Float64())
	}
	return sc
}

type violation struct{ inv, what string }

type sim struct {
	sc    scenario
	rng   *rand.Rand
	views []*simView
	tick  int
	bad   []violation
	trace func(format string, args ...any) // nil: quiet
}

func newSim(sc scenario) *sim {
	s := &sim{sc: sc, rng: rand.New(rand.NewPCG(sc.seed, 11))}
	used := map[string]bool{}
	for i := range sc.views {
		v := &simView{commit: sc.commits[i], rate: sc.rates[i], started: true, yieldedTo: -1}
		for len(v.members) < sc.members[i] {
			id := fmt.Sprintf("10.0.%d.%d:7000", s.rng.IntN(4), s.rng.IntN(200))
			if !used[id] {
				used[id] = true
				v.members = append(v.members, id)
			}
		}
		slices.Sort(v.members)
		v.own = Own{Lead: v.members[0], Published: v.commit}
		v.history = []pub{{started: true, lead: v.members[0], commit: v.commit}}
		s.views = append(s.views, v)
	}
	for _, v := range s.views {
		v.seen = make([][]int, len(v.members))
		for m := range v.seen {
			v.seen[m] = make([]int, len(s.views))
		}
	}
	return s
}

func (s *sim) fail(inv, format string, args ...any) {
	s.bad = append(s.bad, violation{inv, fmt.Sprintf("tick %d: ", s.tick) + fmt.Sprintf(format, args...)})
}

// run runs the scenario and returns the violations of the invariants:
//
//	I1: some view of the job is always started;
//	I2: no two views yield to each other;
//	I3: every yield goes to a view that ranks above the yielder, as
//	    each last published (the lead it had then);
//	L1: once gossip is current, one view is left within settleTicks.
func (s *sim) run() []violation {
	const settleTicks = 150
	for s.tick = 0; s.tick < s.sc.faulty+settleTicks; s.tick++ {
		faulty := s.tick < s.sc.faulty
		s.gossip(faulty)
		if faulty && s.sc.crash > 0 && s.rng.Float64() < s.sc.crash {
			s.crashOne()
		}
		for _, v := range s.views {
			if v.started && s.rng.Float64() < v.rate {
				s.boundary(v)
			}
		}
		s.check()
	}
	if n := s.startedViews(); n != 1 {
		s.fail("L1", "%d views started %d ticks after gossip became current", n, settleTicks)
	}
	return s.bad
}

// gossip lets each member's picture of each other view catch up: by a
// random amount while faulty; after, to what was published lag ticks ago.
func (s *sim) gossip(faulty bool) {
	for _, v := range s.views {
		for m := range v.seen {
			for k, o := range s.views {
				if o == v {
					continue
				}
				latest := len(o.history) - 1
				switch {
				case !faulty:
					for v.seen[m][k] < latest && o.history[v.seen[m][k]+1].tick <= s.tick-s.sc.lag {
						v.seen[m][k]++
					}
				case s.rng.Float64() < s.sc.catchUp && v.seen[m][k] < latest:
					v.seen[m][k] += 1 + s.rng.IntN(latest-v.seen[m][k])
				}
			}
		}
	}
}

// crashOne kills a member of a view that has another, so that no view
// dies whole: the check is of the merge, not of recovery.
func (s *sim) crashOne() {
	v := s.views[s.rng.IntN(len(s.views))]
	if !v.started || len(v.members) < 2 {
		return
	}
	m := s.rng.IntN(len(v.members))
	v.members = slices.Delete(v.members, m, m+1)
	v.seen = slices.Delete(v.seen, m, m+1)
}

// boundary runs one boundary of v.
func (s *sim) boundary(v *simView) {
	v.commit++
	v.own.Lead = min(v.own.Lead, v.members[0]) // only a joiner could lower it
	if mutate.liveOwn {
		v.own.Published = v.commit
	}
	verdicts := make([]Verdict, len(v.members))
	for m := range v.members {
		var sights []Sight
		for k, o := range s.views {
			if o == v {
				continue
			}
			if p := o.history[v.seen[m][k]]; p.started {
				sights = append(sights, Sight{Lead: p.lead, Commit: p.commit})
			}
		}
		verdicts[m] = Judge(v.own, sights)
	}
	verdict := Agree(verdicts)
	if s.trace != nil && verdict.Yield {
		s.trace("tick %d: %s (commit %d, published %d) verdicts %+v -> yield to view %d", s.tick, v.members[0], v.commit, v.own.Published, verdicts, s.byHash(verdict.To))
	}
	if !verdict.Yield {
		if s.tick-v.lastPub >= publishEvery {
			v.own.Published, v.lastPub = v.commit, s.tick
			v.history = append(v.history, pub{started: true, lead: v.own.Lead, commit: v.commit, tick: s.tick})
		}
		return
	}
	to := s.byHash(verdict.To)
	if to < 0 {
		s.fail("I3", "view %s yields to a view no one leads", v.members[0])
		return
	}
	o := s.views[to]
	if o.yieldedTo >= 0 && s.views[o.yieldedTo] == v {
		s.fail("I2", "views %s and %s yield to each other (ticks %d and %d)", v.members[0], s.leadOf(to), o.yieldedAt, s.tick)
	}
	v.started, v.yieldedTo, v.yieldedAt = false, to, s.tick
	v.key = Sight{Lead: v.own.Lead, Commit: v.own.Published}
	v.history = append(v.history, pub{lead: v.own.Lead, commit: v.commit, tick: s.tick})
	s.checkRank(v)
}

// checkRank checks I3 for every yield made so far: each yielder ranks
// below its target's last published rank.
func (s *sim) checkRank(v *simView) {
	to := s.views[v.yieldedTo]
	last := to.history[len(to.history)-1]
	for i := len(to.history) - 1; i >= 0 && !to.history[i].started; i-- {
		last = to.history[max(i-1, 0)]
	}
	if !Above(last.commit, last.lead, v.key.Commit, v.key.Lead) && !mutate.tiesYield {
		s.fail("I3", "view %s (published %d) yields to view %s, last published at %d", v.key.Lead, v.key.Commit, last.lead, last.commit)
	}
}

// byHash returns the view whose current or earlier lead hashes to h, or
// -1: a picture may name a lead the view has since lost.
func (s *sim) byHash(h uint64) int {
	for i, v := range s.views {
		for _, p := range v.history {
			if LeadHash(p.lead) == h {
				return i
			}
		}
	}
	return -1
}

func (s *sim) leadOf(i int) string { return s.views[i].own.Lead }

func (s *sim) startedViews() int {
	n := 0
	for _, v := range s.views {
		if v.started {
			n++
		}
	}
	return n
}

func (s *sim) check() {
	if s.startedViews() == 0 && !slices.ContainsFunc(s.bad, func(v violation) bool { return v.inv == "I1" }) {
		s.fail("I1", "every view yielded")
	}
}

// TestSimulation: the invariants hold in random schedules of 2 and 3
// views, with gossip's delays and crashes.
func TestSimulation(t *testing.T) {
	runs := 3000
	if testing.Short() {
		runs = 300
	}
	for seed := range uint64(runs) {
		sc := randomScenario(seed)
		if bad := newSim(sc).run(); len(bad) > 0 {
			t.Fatalf("%v\n%s: %s", sc, bad[0].inv, bad[0].what)
		}
	}
}

// TestMutations: each broken rule is caught by the simulator.
func TestMutations(t *testing.T) {
	for _, tc := range []struct {
		name string
		on   func(bool)
		want string
	}{
		{"ties yield both ways", func(b bool) { mutate.tiesYield = b }, "I2"},
		{"a view compares its live iteration with published ones", func(b bool) { mutate.liveOwn = b }, "L1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.on(true)
			defer tc.on(false)
			found := map[string]string{}
			for seed := range uint64(3000) {
				sc := randomScenario(seed)
				for _, v := range newSim(sc).run() {
					if found[v.inv] == "" {
						found[v.inv] = sc.String() + ": " + v.what
					}
				}
				if found[tc.want] != "" {
					break
				}
			}
			if found[tc.want] == "" {
				t.Errorf("no %s violation found; found %v", tc.want, found)
			}
		})
	}
}
