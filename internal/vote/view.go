package vote

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/gyre-ml/gyre/transport"
)

// The next view is decided from a boundary's table by decideView, with no
// coordinator: every member holds the same table and runs the same pure
// code. Gossip is only a hint: the vote's own allgather proves every
// member alive and reachable, and no difference between the members'
// gossip fails a boundary. The rule:
//   - a member whose record asks to leave is removed;
//   - a pending joiner is admitted when every current member lists it,
//     while the smallest MaxWorkers in the table leaves room, in ring
//     order;
//   - before iteration 0, training starts once the view holds the largest
//     MinWorkers in the table; later leaves may shrink the view below it;
//   - the next view is sorted by data address (host, then port), and its
//     epoch is one higher when its members differ.

// Member is a view member: its transport ID and advertised data address.
type Member struct {
	ID   transport.PeerID
	Addr string
}

// JoinerHash names a pending joiner in a fixed-size record slot. It covers
// the address too, so members that admit a joiner agree on where it is.
func JoinerHash(m Member) uint64 {
	h := fnv.New64a()
	h.Write([]byte(m.ID))
	h.Write([]byte{0})
	h.Write([]byte(m.Addr))
	return max(h.Sum64(), 1) // 0 marks an empty slot
}

// ListJoiners fills a record's joiner slots with hashes of pending: those
// that come first in an order that salt (the boundary's iteration)
// shuffles, the same on every member, so that members seeing the same
// joiners list the same ones, and joiners that some member cannot list
// do not keep the slots from the others boundary after boundary.
func ListJoiners(pending []Member, salt uint64) [JoinerSlots]uint64 {
	hs := make([]uint64, len(pending))
	for i, m := range pending {
		hs[i] = JoinerHash(m)
	}
	slices.Sort(hs)
	hs = slices.Compact(hs)
	slices.SortFunc(hs, func(a, b uint64) int { return cmp.Compare(mix(a^salt), mix(b^salt)) })
	var out [JoinerSlots]uint64
	copy(out[:], hs)
	return out
}

// mix is SplitMix64's finalizer: a bijection that scatters nearby values.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// ViewDecision is what one boundary decided about membership.
type ViewDecision struct {
	// Members is the next view in ring order; Changed says it differs
	// from the current one.
	Members []Member
	Changed bool
	// Admitted and Left are the members added and removed.
	Admitted, Left []Member
	// Start says the view is large enough for iteration 0 (before it).
	Start bool
	// Promoted says the view changes only to count its joiners as
	// voters (PromoteJoiners).
	Promoted bool
	// Capped counts joiners every member listed but MaxWorkers, or a
	// global batch too small for one more minimum share, kept out.
	Capped int
}

// DecideView applies the membership rule to a boundary's table. cur is the
// current view in ring order, recs the records in rank order. known
// resolves the joiner hashes this worker listed; a joiner every member
// listed is one this worker listed, so it always resolves. batchFit is
// the most workers the global batch can give their minimum share (0: no
// limit); joiners beyond it stay pending, as beyond MaxWorkers; maxView
// bounds every view.
func DecideView(iter int64, cur []Member, recs []Record, known map[uint64]Member, batchFit, maxView int) (ViewDecision, error) {
	var d ViewDecision
	maxWorkers, minWorkers := int64(maxView), int64(1)
	for _, rec := range recs {
		if rec.MaxWorkers > 0 {
			maxWorkers = min(maxWorkers, rec.MaxWorkers)
		}
		minWorkers = max(minWorkers, rec.MinWorkers)
	}
	for r, m := range cur {
		if recs[r].Leave {
			d.Left = append(d.Left, m)
		} else {
			d.Members = append(d.Members, m)
		}
	}
	var joiners []Member
	for _, h := range recs[0].Joiners {
		if h == 0 || !listedByAll(recs, h) {
			continue
		}
		m, ok := known[h]
		if !ok {
			return d, fmt.Errorf("gyre: boundary of iteration %d: joiner %016x is listed by every member but unknown here", iter, h)
		}
		joiners = append(joiners, m)
	}
	slices.SortFunc(joiners, CompareMembers)
	limit := int(maxWorkers)
	if batchFit > 0 {
		limit = min(limit, batchFit)
	}
	room := max(limit-len(d.Members), 0)
	if len(joiners) > room {
		d.Capped = len(joiners) - room
		joiners = joiners[:room]
	}
	d.Admitted = joiners
	d.Members = append(d.Members, joiners...)
	slices.SortFunc(d.Members, CompareMembers)
	d.Changed = len(d.Admitted) > 0 || len(d.Left) > 0
	d.Start = int64(len(d.Members)) >= minWorkers
	return d, nil
}

// PromoteJoiners makes d a view change when it is none and the current
// view has joiners: the same members at the next epoch, in which they
// vote. A joiner counts for no majority in the view that admitted it,
// as it held none of its state; by the next boundary it holds the state
// and a commit like any member, and a job that grew from one seed by
// joiners would otherwise hang on that seed's life. Every member holds
// the same view, so all decide alike.
func PromoteJoiners(d *ViewDecision, joiners []transport.PeerID) {
	if d.Changed || len(joiners) == 0 {
		return
	}
	d.Changed, d.Promoted = true, true
}

func listedByAll(recs []Record, h uint64) bool {
	for _, rec := range recs {
		if !slices.Contains(rec.Joiners[:], h) {
			return false
		}
	}
	return true
}

// CompareMembers orders members by data address: host (as an IP where it
// parses, so 10.0.0.9 comes before 10.0.0.10), then port, then ID.
func CompareMembers(a, b Member) int {
	ah, ap := splitAddr(a.Addr)
	bh, bp := splitAddr(b.Addr)
	if c := compareHosts(ah, bh); c != 0 {
		return c
	}
	return cmp.Or(cmp.Compare(ap, bp), cmp.Compare(a.ID, b.ID))
}

// splitAddr splits host:port, or [host]:port, as net.SplitHostPort does,
// without importing package net into pure code. An address it cannot
// split is all host, with port 0.
func splitAddr(addr string) (string, int) {
	var host, port string
	switch {
	case strings.HasPrefix(addr, "["):
		end := strings.IndexByte(addr, ']')
		if end < 0 || end+1 >= len(addr) || addr[end+1] != ':' {
			return addr, 0
		}
		host, port = addr[1:end], addr[end+2:]
		if strings.ContainsAny(port, "[]") {
			return addr, 0
		}
	case strings.Count(addr, ":") == 1:
		host, port, _ = strings.Cut(addr, ":")
		if strings.ContainsAny(addr, "[]") {
			return addr, 0
		}
	default:
		return addr, 0
	}
	p, _ := strconv.Atoi(port)
	return host, p
}

func compareHosts(a, b string) int {
	ai, aerr := netip.ParseAddr(a)
	bi, berr := netip.ParseAddr(b)
	switch {
	case aerr == nil && berr == nil:
		return ai.Compare(bi)
	case aerr == nil:
		return -1 // addresses before names
	case berr == nil:
		return 1
	}
	return cmp.Compare(a, b)
}

// ViewDigest hashes a view and shares, for the decision check.
func ViewDigest(epoch uint64, members []Member, shares []int) uint64 {
	h := fnv.New64a()
	put := func(v uint64) { h.Write(binary.LittleEndian.AppendUint64(nil, v)) }
	put(epoch)
	for _, m := range members {
		h.Write([]byte(m.ID))
		h.Write([]byte{0})
		h.Write([]byte(m.Addr))
		h.Write([]byte{0})
	}
	for _, s := range shares {
		put(uint64(s))
	}
	return h.Sum64()
}

// ViewJoiners are the joiners that a view admitting admitted at iter
// keeps out of its recoveries' majorities: they hold none of its state
// until the view's state broadcast ends. Before iteration 0 nobody holds
// any, and every member of the first view votes, so that losing the
// seed worker is survived like losing any other.
func ViewJoiners(iter int64, admitted []Member) []transport.PeerID {
	if iter == 0 {
		return nil
	}
	return PeerIDs(admitted)
}

// PeerIDs returns the transport IDs of ms.
func PeerIDs(ms []Member) []transport.PeerID {
	ids := make([]transport.PeerID, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}

// Names returns the members' IDs as strings, nil for none.
func Names(ms []Member) []string {
	if len(ms) == 0 {
		return nil
	}
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m.ID)
	}
	return out
}
