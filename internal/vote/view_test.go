package vote

import (
	"fmt"
	"math/rand/v2"
	"net"
	"reflect"
	"slices"
	"strconv"
	"testing"

	"github.com/gyre-ml/gyre/balance"
	"github.com/gyre-ml/gyre/transport"
)

// maxView is the largest view of the tests, gyre.MaxView.
const maxView = 256

func testMembers(addrs ...string) []Member {
	out := make([]Member, len(addrs))
	for i, a := range addrs {
		out[i] = Member{ID: transport.PeerID("w" + a), Addr: a}
	}
	return out
}

// simWorker is one worker's local knowledge in the simulator: which
// joiners it lists, and whether it asked to leave.
type simWorker struct {
	self     Member
	pending  []Member
	leave    bool
	min, max int
}

// simBoundary builds every worker's record as the worker does, then runs
// decideView on each worker's copy of the table, and checks that all reach
// the same outcome.
func simBoundary(t *testing.T, view []Member, ws []simWorker) (ViewDecision, error) {
	t.Helper()
	return simBoundaryFit(t, view, ws, 0)
}

// simBoundaryFit is simBoundary with a limit on the workers the global
// batch fits.
func simBoundaryFit(t *testing.T, view []Member, ws []simWorker, batchFit int) (ViewDecision, error) {
	t.Helper()
	recs := make([]Record, len(ws))
	knowns := make([]map[uint64]Member, len(ws))
	for r, w := range ws {
		rec := Record{Kind: KindBoundary, Leave: w.leave, MinWorkers: int64(max(w.min, 1)), MaxWorkers: int64(cmpOr(w.max, maxView))}
		rec.Joiners = ListJoiners(w.pending, 7)
		knowns[r] = map[uint64]Member{}
		for _, m := range w.pending {
			knowns[r][JoinerHash(m)] = m
		}
		// The record crosses the wire.
		recs[r], _ = Decode(rec.Encode())
	}
	var first ViewDecision
	var firstErr error
	for r := range ws {
		d, err := DecideView(7, view, recs, knowns[r], batchFit, maxView)
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

func workersOf(view []Member) []simWorker {
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
	j1 := Member{ID: "j1", Addr: "127.0.0.1:9004"}
	j2 := Member{ID: "j2", Addr: "127.0.0.1:9001"}
	ws := workersOf(view)
	ws[0].pending = []Member{j1, j2}
	ws[1].pending = []Member{j2} // has not heard of j1 yet
	d, err := simBoundary(t, view, ws)
	if err != nil {
		t.Fatal(err)
	}
	want := []Member{j2, view[0], view[1]} // ring order by address
	if !d.Changed || !slices.Equal(d.Members, want) || !slices.Equal(d.Admitted, []Member{j2}) {
		t.Fatalf("admitted %v, view %v; want j2 only and view %v", d.Admitted, d.Members, want)
	}
	ws[1].pending = []Member{j1, j2}
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
	want := []Member{view[0], view[2], joiners[0], joiners[1]}
	if !slices.Equal(d.Members, want) || !slices.Equal(d.Left, []Member{view[1]}) || d.Capped != 1 {
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
// duplicates, keeps every Member that did not leave, admits only joiners
// all listed, and respects MaxWorkers.
func TestDecideRandomTables(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 500 {
		n := 1 + rng.IntN(6)
		var pool []Member
		for i := range 12 {
			pool = append(pool, Member{ID: transport.PeerID(fmt.Sprintf("n%d", i)), Addr: fmt.Sprintf("10.0.%d.%d:%d", rng.IntN(3), rng.IntN(3), 7000+i)})
		}
		view := slices.Clone(pool[:n])
		slices.SortFunc(view, CompareMembers)
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
		if !slices.IsSortedFunc(d.Members, CompareMembers) {
			t.Fatalf("trial %d: view not in address order: %v", trial, d.Members)
		}
		for r, m := range view {
			if in := slices.Contains(d.Members, m); in == ws[r].leave {
				t.Fatalf("trial %d: Member %v leave=%v but in next view=%v", trial, m, ws[r].leave, in)
			}
		}
		tableMax := maxView
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
	slices.SortFunc(ms, CompareMembers)
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
	r := Record{Kind: KindBoundary, Iter: 9, Share: 3, Compute: 4, Decision: 5, Status: StatusTimeout, Digest: 6,
		HashNs: 7, Layout: 8, Wall: 10, Leave: true, MinWorkers: 2, MaxWorkers: 30,
		Model: balance.Model{FixedNs: 11, RateMicro: 12, Flat: true, NoisePpm: 15}, SpeedChanged: true, MinShare: 1, MaxShare: 13, Headroom: 14 << 30,
		Epoch: 16, DirEpoch: 17, CkptFailed: true, MergeTo: 1 << 63, MergeCommit: 18}
	r.Joiners[7] = 99
	row := r.Encode()
	if len(row) != Len {
		t.Fatalf("encoded %d words, want %d", len(row), Len)
	}
	got, version := Decode(row)
	if got != r || version != Version {
		t.Fatalf("round trip: %+v version %d", got, version)
	}
}

// TestListJoinersRotates: with more joiners than slots, every joiner is
// listed at some boundary, and members listing the same joiners at the
// same boundary list the same ones.
func TestListJoinersRotates(t *testing.T) {
	var pending []Member
	for i := range 3 * JoinerSlots {
		pending = append(pending, Member{ID: transport.PeerID(fmt.Sprintf("j%d", i)), Addr: fmt.Sprintf("10.0.0.%d:7000", i)})
	}
	seen := map[uint64]bool{}
	for iter := range uint64(50) {
		a := ListJoiners(pending, iter)
		b := ListJoiners(reversed(pending), iter)
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

func reversed(ms []Member) []Member {
	out := slices.Clone(ms)
	slices.Reverse(out)
	return out
}

// TestSplitAddrAsNet: splitAddr splits every address as net.SplitHostPort
// does, and takes what it cannot split as all host.
func TestSplitAddrAsNet(t *testing.T) {
	for _, addr := range []string{"10.0.0.1:7946", "host-b:1", "[::1]:7947", "[fe80::1%eth0]:9", "::1", "[::1]", "r2",
		"a:b:c", "10.0.0.1:", ":7946", "[::1]:x", "10.0.0.1:port", "]:1", "[::1]]:1", "[::1]:[2]", ""} {
		host, port := splitAddr(addr)
		h, p, err := net.SplitHostPort(addr)
		if err != nil {
			h, p = addr, "0"
		}
		if want, _ := strconv.Atoi(p); host != h || port != want {
			t.Errorf("splitAddr(%q) = %q, %d; net says %q, %q (%v)", addr, host, port, h, p, err)
		}
	}
}
