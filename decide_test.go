package gyre

import (
	"fmt"
	"github.com/gyre-ml/gyre/balance"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/gyre-ml/gyre/transport"
)

func testMembers(addrs ...string) []member {
	out := make([]member, len(addrs))
	for i, a := range addrs {
		out[i] = member{ID: transport.PeerID("w" + a), Addr: a}
	}
	return out
}

// simWorker is one worker's local knowledge in the simulator: which
// joiners it lists, and whether it asked to leave.
type simWorker struct {
	self     member
	pending  []member
	leave    bool
	min, max int
}

// simBoundary builds every worker's record as the worker does, then runs
// decideView on each worker's copy of the table, and checks that all reach
// the same outcome.
func simBoundary(t *testing.T, view []member, ws []simWorker) (viewDecision, error) {
	t.Helper()
	return simBoundaryFit(t, view, ws, 0)
}

// simBoundaryFit is simBoundary with a limit on the workers the global
// batch fits.
func simBoundaryFit(t *testing.T, view []member, ws []simWorker, batchFit int) (viewDecision, error) {
	t.Helper()
	recs := make([]record, len(ws))
	knowns := make([]map[uint64]member, len(ws))
	for r, w := range ws {
		rec := record{kind: kindBoundary, leave: w.leave, minWorkers: int64(max(w.min, 1)), maxWorkers: int64(cmpOr(w.max, MaxView))}
		rec.joiners = listJoiners(w.pending, 7)
		knowns[r] = map[uint64]member{}
		for _, m := range w.pending {
			knowns[r][joinerHash(m)] = m
		}
		// The record crosses the wire.
		recs[r], _ = decodeRecord(rec.encode())
	}
	var first viewDecision
	var firstErr error
	for r := range ws {
		d, err := decideView(7, view, recs, knowns[r], batchFit)
		if r == 0 {
			first, firstErr = d, err
			continue
		}
		if !reflect.DeepEqual(d, first) || fmt.Sprint(err) != fmt.Sprint(firstErr) {
			t.Fatalf("rank %d decided %+v, %v; rank 0 %+v, %v", r, d, err, first, firstErr)
		}
	}
	return first, firstErr
}

func cmpOr(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func workersOf(view []member) []simWorker {
	ws := make([]simWorker, len(view))
	for r, m := range view {
		ws[r] = simWorker{self: m}
	}
	return ws
}

func TestDecideNoChange(t *testing.T) {
	view := testMembers("127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003")
	d, err := simBoundary(t, view, workersOf(view))
	if err != nil || d.Changed || !slices.Equal(d.Members, view) || !d.Start {
		t.Fatalf("steady view: %+v, %v", d, err)
	}
}

func TestDecideAdmitsOnlyJoinersEveryMemberLists(t *testing.T) {
	view := testMembers("127.0.0.1:9003", "127.0.0.1:9005")
	j1 := member{ID: "j1", Addr: "127.0.0.1:9004"}
	j2 := member{ID: "j2", Addr: "127.0.0.1:9001"}
	ws := workersOf(view)
	ws[0].pending = []member{j1, j2}
	ws[1].pending = []member{j2} // has not heard of j1 yet
	d, err := simBoundary(t, view, ws)
	if err != nil {
		t.Fatal(err)
	}
	want := []member{j2, view[0], view[1]} // ring order by address
	if !d.Changed || !slices.Equal(d.Members, want) || !slices.Equal(d.Admitted, []member{j2}) {
		t.Fatalf("admitted %v, view %v; want j2 only and view %v", d.Admitted, d.Members, want)
	}
	ws[1].pending = []member{j1, j2}
	if d, _ = simBoundary(t, view, ws); len(d.Admitted) != 2 {
		t.Fatalf("once both list j1, both are admitted; got %v", d.Admitted)
	}
}

func TestDecideLeaveAndMaxWorkers(t *testing.T) {
	view := testMembers("127.0.0.1:9001", "127.0.0.1:9002", "127.0.0.1:9003")
	joiners := testMembers("127.0.0.1:9010", "127.0.0.1:9011", "127.0.0.1:9012")
	ws := workersOf(view)
	for r := range ws {
		ws[r].pending = joiners
		ws[r].max = 4
	}
	ws[1].leave = true
	d, err := simBoundary(t, view, ws)
	if err != nil {
		t.Fatal(err)
	}
	// One leaves, so two of the three joiners fit under MaxWorkers 4.
	want := []member{view[0], view[2], joiners[0], joiners[1]}
	if !slices.Equal(d.Members, want) || !slices.Equal(d.Left, []member{view[1]}) || d.Capped != 1 {
		t.Fatalf("view %v left %v capped %d; want %v, [%v], 1", d.Members, d.Left, d.Capped, want, view[1])
	}
}

// TestDecideGlobalBatchLimitsAdmission: with a global batch of 3 and at
// least one sample per worker, a view of 2 admits one of two joiners; the
// other stays pending (Capped).
func TestDecideGlobalBatchLimitsAdmission(t *testing.T) {
	view := testMembers("127.0.0.1:9001", "127.0.0.1:9002")
	joiners := testMembers("127.0.0.1:9010", "127.0.0.1:9011")
	ws := workersOf(view)
	for r := range ws {
		ws[r].pending = joiners
	}
	d, err := simBoundaryFit(t, view, ws, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Members) != 3 || !slices.Equal(d.Admitted, joiners[:1]) || d.Capped != 1 {
		t.Fatalf("view %v admitted %v capped %d; want one joiner in and one pending", d.Members, d.Admitted, d.Capped)
	}
	if d, _ := simBoundaryFit(t, view, ws, 0); len(d.Admitted) != 2 {
		t.Fatalf("with no limit %v were admitted", d.Admitted)
	}
}

func TestDecideMinWorkersGatesStart(t *testing.T) {
	view := testMembers("127.0.0.1:9001")
	ws := workersOf(view)
	ws[0].min = 3
	ws[0].pending = testMembers("127.0.0.1:9002")
	d, err := simBoundary(t, view, ws)
	if err != nil || d.Start || len(d.Members) != 2 {
		t.Fatalf("2 of 3: start %v, %d members, %v", d.Start, len(d.Members), err)
	}
	ws[0].pending = testMembers("127.0.0.1:9002", "127.0.0.1:9003")
	if d, _ = simBoundary(t, view, ws); !d.Start {
		t.Fatal("3 of 3 did not start")
	}
}

// TestDecideRandomTables checks invariants over random tables: every
// worker decides alike (simBoundary), the view is sorted, has no
// duplicates, keeps every member that did not leave, admits only joiners
// all listed, and respects MaxWorkers.
func TestDecideRandomTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		n := 1 + rng.IntN(6)
		var pool []member
		for i := range 12 {
			pool = append(pool, member{ID: transport.PeerID(fmt.Sprintf("n%d", i)), Addr: fmt.Sprintf("10.0.%d.%d:%d", rng.IntN(3), rng.IntN(3), 7000+i)})
		}
		view := slices.Clone(pool[:n])
		slices.SortFunc(view, compareMembers)
		candidates := pool[n:]
		ws := workersOf(view)
		maxW := 1 + rng.IntN(10)
		for r := range ws {
			ws[r].max = maxW + rng.IntN(3)
			ws[r].leave = rng.IntN(5) == 0
			for _, c := range candidates {
				if rng.IntN(4) > 0 {
					ws[r].pending = append(ws[r].pending, c)
				}
			}
		}
		d, err := simBoundary(t, view, ws)
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if !slices.IsSortedFunc(d.Members, compareMembers) {
			t.Fatalf("trial %d: view not in address order: %v", trial, d.Members)
		}
		for r, m := range view {
			if in := slices.Contains(d.Members, m); in == ws[r].leave {
				t.Fatalf("trial %d: member %v leave=%v but in next view=%v", trial, m, ws[r].leave, in)
			}
		}
		tableMax := MaxView
		for _, w := range ws {
			tableMax = min(tableMax, w.max)
		}
		stay := len(view) - len(d.Left)
		if len(d.Members) > max(tableMax, stay) || len(d.Admitted) > 0 && len(d.Members) > tableMax {
			t.Fatalf("trial %d: %d members past MaxWorkers %d", trial, len(d.Members), tableMax)
		}
		for _, a := range d.Admitted {
			for r := range ws {
				if !slices.Contains(ws[r].pending, a) {
					t.Fatalf("trial %d: admitted %v which rank %d did not list", trial, a, r)
				}
			}
		}
	}
}

func TestCompareMembersOrdersIPsNumerically(t *testing.T) {
	ms := testMembers("10.0.0.10:1", "10.0.0.9:2", "10.0.0.9:10", "host-b:1", "10.0.0.9:9")
	slices.SortFunc(ms, compareMembers)
	var got []string
	for _, m := range ms {
		got = append(got, m.Addr)
	}
	want := []string{"10.0.0.9:2", "10.0.0.9:9", "10.0.0.9:10", "10.0.0.10:1", "host-b:1"}
	if !slices.Equal(got, want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestRecordRoundTrip(t *testing.T) {
	r := record{kind: kindBoundary, iter: 9, share: 3, compute: 4, decision: 5, status: statusTimeout, digest: 6,
		hashNs: 7, layout: 8, wall: 10, leave: true, minWorkers: 2, maxWorkers: 30,
		model: balance.Model{FixedNs: 11, RateMicro: 12, Flat: true, NoisePpm: 15}, speedChanged: true, minShare: 1, maxShare: 13, headroom: 14 << 30}
	r.joiners[7] = 99
	row := r.encode()
	if len(row) != recordLen {
		t.Fatalf("encoded %d words, want %d", len(row), recordLen)
	}
	got, version := decodeRecord(row)
	if got != r || version != recordVersion {
		t.Fatalf("round trip: %+v version %d", got, version)
	}
}

// TestFitRoundTrip: a member's fit, as syncFits broadcasts it, decodes
// to the same fit, and zero words to none.
func TestFitRoundTrip(t *testing.T) {
	for _, f := range []balance.Worker{
		{Model: balance.Model{FixedNs: 1, RateMicro: 2, NoisePpm: 3, Flat: true}, Min: 4, Max: 5},
		{Model: balance.Model{RateMicro: 7}, Min: 1},
		{Min: 1}, // bounds, no model yet
	} {
		words := make([]int64, fitWords)
		encodeFit(words, f)
		if got, ok := decodeFit(words); !ok || got != f {
			t.Fatalf("%+v: decoded %+v, %v", f, got, ok)
		}
	}
	if _, ok := decodeFit(make([]int64, fitWords)); ok {
		t.Fatal("zero words decoded as a fit")
	}
}

// TestListJoinersRotates: with more joiners than slots, every joiner is
// listed at some boundary, and members listing the same joiners at the
// same boundary list the same ones.
func TestListJoinersRotates(t *testing.T) {
	var pending []member
	for i := range 3 * joinerSlots {
		pending = append(pending, member{ID: transport.PeerID(fmt.Sprintf("j%d", i)), Addr: fmt.Sprintf("10.0.0.%d:7000", i)})
	}
	seen := map[uint64]bool{}
	for iter := range uint64(50) {
		a := listJoiners(pending, iter)
		b := listJoiners(reversed(pending), iter)
		if a != b {
			t.Fatalf("iteration %d: members list %v and %v", iter, a, b)
		}
		for _, h := range a {
			seen[h] = true
		}
	}
	if len(seen) != len(pending) {
		t.Fatalf("%d of %d joiners were ever listed in 50 boundaries", len(seen), len(pending))
	}
}

func reversed(ms []member) []member {
	out := slices.Clone(ms)
	slices.Reverse(out)
	return out
}
