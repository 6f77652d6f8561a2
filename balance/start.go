package balance

// Start returns the shares a new view starts from, in the order of ws:
// each worker without a Known model (a joiner) gets an equal share,
// B/len(ws) within its bounds, and Solve spreads the rest over the
// workers whose models are known. With no model known the shares are
// equal, the first B mod len(ws) workers one more. Like Solve, the result
// depends only on its integer inputs, so every member of a view that
// holds the same models computes the same shares.
func Start(ws []Worker, B int) ([]int, error) {
	lo, hi, err := bounds(ws, B)
	if err != nil {
		return nil, err
	}
	n := len(ws)
	var known []Worker
	var at []int // index in ws of each of known
	for i, w := range ws {
		if w.Model.Known() {
			known = append(known, w)
			at = append(at, i)
		}
	}
	if len(known) == n {
		return Solve(ws, B)
	}
	shares := make([]int, n)
	if len(known) == 0 {
		for i := range shares {
			shares[i] = B / n
			if i < B%n {
				shares[i]++
			}
		}
		return shares, nil
	}
	rest := B
	for i, w := range ws {
		if !w.Model.Known() {
			shares[i] = min(max(B/n, lo[i]), hi[i])
			rest -= shares[i]
		}
	}
	solved, err := Solve(known, rest)
	if err != nil {
		return nil, err
	}
	for k, i := range at {
		shares[i] = solved[k]
	}
	return shares, nil
}
