package ring

import "slices"

// Choosing the ring order from measured link speeds is a pure function of
// the speed table, like the plans: every worker holds the same table and
// derives the same order, with integer arithmetic only.

// ChooseOrder returns a ring order (for Config.Order) for the link speeds
// speed, where speed[i][j] is the measured speed from rank i to rank j in
// bytes per second (0: unknown, treated as the slowest link), as measured
// by i. It returns
// nil, rank order, unless another order is at least 10% cheaper.
//
// An order's cost is the sum over its links (i to the next) of the time a
// byte takes on it: a ring allreduce moves the same bytes over every link,
// and links that share a slow uplink share its speed too, so crossing it
// fewer times is what makes the ring faster. A probe can only
// under-measure a link (a transfer still ramping up, a busy CPU), so a
// pair's speed is the faster of its two directions. Speeds are then grouped
// into tiers, a new tier starting wherever the sorted speeds jump by more
// than 1.5×, and every link costs as the slowest of its tier: measurement
// noise between links of one kind does not then reorder the ring. Up to
// exactOrderMax ranks the cheapest order is found exactly; beyond, by
// nearest neighbour and then moving single ranks while that helps.
func ChooseOrder(speed [][]int64) []int {
	n := len(speed)
	if n < 4 {
		return nil // every ring of 3 or fewer is the same ring
	}
	cost := linkCosts(speed)
	var best []int
	if n <= exactOrderMax {
		best = cheapestRing(cost)
	} else {
		best = improveRing(cost, nearestRing(cost))
	}
	if ringCost(cost, best)*10 > ringCost(cost, RankOrder(n))*9 {
		return nil
	}
	return best
}

// RankOrder returns rank order as an explicit ring order, 0 to n-1: what
// a nil Config.Order means.
func RankOrder(n int) []int {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	return order
}

// exactOrderMax is the most ranks ChooseOrder orders exactly: the search
// takes n²·2ⁿ steps.
const exactOrderMax = 12

// tierGap is the jump between sorted link speeds that starts a new tier,
// tierGap[0]/tierGap[1]: 1.5. Noise between links of one kind moves
// sorted neighbours far less; over QUIC on 6 namespace hosts of 2 cores,
// rack links measured 48 to 80 MB/s and links over a 200 Mbit/s trunk
// 23 to 25, a gap of 1.9 that the earlier 2 merged into one tier.
var tierGap = [2]int64{3, 2}

// linkCosts returns cost[i][j], the time a byte takes between i and j in
// units of 2⁻⁴⁰ s at the floor speed of the pair's tier.
func linkCosts(speed [][]int64) [][]int64 {
	n := len(speed)
	at := func(i, j int) int64 { // the pair's speed: the faster direction
		if j >= len(speed[i]) || i >= len(speed[j]) {
			return 0
		}
		return max(speed[i][j], speed[j][i])
	}
	var known []int64
	for i := range n {
		for j := range n {
			if s := at(i, j); i != j && s > 0 {
				known = append(known, s)
			}
		}
	}
	slices.Sort(known)
	floors := make([]int64, len(known)) // the slowest speed of each one's tier
	for i, s := range known {
		floors[i] = s
		if i > 0 && s*tierGap[1] <= tierGap[0]*known[i-1] {
			floors[i] = floors[i-1]
		}
	}
	floor := func(s int64) int64 {
		i, _ := slices.BinarySearch(known, s)
		return floors[i]
	}
	cost := make([][]int64, n)
	for i := range cost {
		cost[i] = make([]int64, n)
		for j := range cost[i] {
			switch s := at(i, j); {
			case i == j:
			case s <= 0:
				cost[i][j] = 1 << 40 // unknown: as slow as 1 byte per second
			default:
				cost[i][j] = max(1, (1<<40)/floor(s))
			}
		}
	}
	return cost
}

// ringCost is the cost of the ring through order, back to its start.
func ringCost(cost [][]int64, order []int) int64 {
	var sum int64
	for i, r := range order {
		sum += cost[r][order[(i+1)%len(order)]]
	}
	return sum
}

// cheapestRing returns the cheapest ring, starting at rank 0, by dynamic
// programming over subsets (Held-Karp). Ties go to the first found, so
// the result is deterministic.
func cheapestRing(cost [][]int64) []int {
	n := len(cost)
	full := 1 << n
	const none = int64(-1)
	// best[mask*n+j]: cheapest path from 0 through the ranks in mask (which
	// holds 0 and j), ending at j; from[...] the rank before j on it.
	best := make([]int64, full*n)
	from := make([]int8, full*n)
	for i := range best {
		best[i] = none
	}
	best[1*n+0] = 0
	for mask := 1; mask < full; mask += 2 { // every path starts at 0
		for j := range n {
			c := best[mask*n+j]
			if c == none {
				continue
			}
			for k := 1; k < n; k++ {
				if mask&(1<<k) != 0 {
					continue
				}
				next := mask | 1<<k
				if v := best[next*n+k]; v == none || c+cost[j][k] < v {
					best[next*n+k], from[next*n+k] = c+cost[j][k], int8(j)
				}
			}
		}
	}
	last, total := 0, none
	for j := 1; j < n; j++ {
		if c := best[(full-1)*n+j] + cost[j][0]; total == none || c < total {
			last, total = j, c
		}
	}
	order := make([]int, n)
	for i, mask, j := n-1, full-1, last; i > 0; i-- {
		order[i] = j
		mask, j = mask&^(1<<j), int(from[mask*n+j])
	}
	return order
}

// nearestRing builds a ring from rank 0 by always going on to the cheapest
// rank not yet in it (the lowest on ties).
func nearestRing(cost [][]int64) []int {
	n := len(cost)
	order, used := []int{0}, make([]bool, n)
	used[0] = true
	for len(order) < n {
		at, next := order[len(order)-1], -1
		for k := range n {
			if !used[k] && (next < 0 || cost[at][k] < cost[at][next]) {
				next = k
			}
		}
		order, used[next] = append(order, next), true
	}
	return order
}

// improveRing moves single ranks (never rank 0, which starts the ring) to
// the place in the ring where they cost least, while a move makes the
// ring strictly cheaper, for at most n passes.
func improveRing(cost [][]int64, order []int) []int {
	n := len(order)
	for range n {
		moved := false
		for i := 1; i < n; i++ {
			r := order[i]
			rest := slices.Delete(slices.Clone(order), i, i+1)
			base := ringCost(cost, rest)
			bestAt, bestCost := i, ringCost(cost, order)
			for at := 1; at <= len(rest); at++ {
				prev, next := rest[at-1], rest[at%len(rest)]
				if c := base - cost[prev][next] + cost[prev][r] + cost[r][next]; c < bestCost {
					bestAt, bestCost = at, c
				}
			}
			if bestAt != i {
				order, moved = slices.Insert(rest, bestAt, r), true
			}
		}
		if !moved {
			break
		}
	}
	return order
}
