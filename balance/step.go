package balance

import "slices"

// Params tune Step. The zero value means the defaults.
type Params struct {
	// Damping is the fraction of the way to Solve's shares that one step
	// moves. Default 0.5.
	Damping float64
	// MinGain is the smallest predicted reduction of the iteration time,
	// relative, for which the shares keep moving. Default 0.02.
	MinGain float64
	// MaxHalvings bounds how often oscillation halves the step. Default 4
	// (a sixteenth of Damping).
	MaxHalvings int
}

func (p Params) withDefaults() Params {
	if p.Damping <= 0 || p.Damping > 1 {
		p.Damping = 0.5
	}
	if p.MinGain <= 0 {
		p.MinGain = 0.02
	}
	if p.MaxHalvings <= 0 {
		p.MaxHalvings = 4
	}
	return p
}

// State is what Step carries from one boundary to the next. Every worker
// must hold the same State (it travels with the shares to a joiner); the
// zero value is the start.
type State struct {
	// Halvings is how often oscillation has halved the step.
	Halvings int
	// Dirs is each worker's last move: -1, 0 or +1.
	Dirs []int8
	// Moving says the shares moved at the last step: the next needs
	// MinGain, not the noise, to move them on.
	Moving bool
}

// Step returns the next shares from the current ones: Solve's shares if
// some worker changed speed (changed, from Estimator.Add), else Damping
// (halved Halvings times) of the way towards them. Shares at rest start
// to move only for a predicted gain above the noise of every worker's
// iterations (Model.NoisePpm; MinGain if larger): a smaller one could not
// be told from noise by the iterations after it, and each move costs the
// trainer its buffers. Once moving, they move on until the gain falls
// below MinGain, so that a damped move does not leave them off balance
// by up to the noise. A worker whose share moves against its previous
// move halves the step for the ones after; a move in which no share
// reverses undoes one halving, so that the early noise of a young fit
// does not leave the shares creeping for the rest of the run. cur must
// meet the bounds and sum to B.
func Step(p Params, st State, ws []Worker, cur []int, B int, changed bool) ([]int, State, error) {
	p = p.withDefaults()
	if len(st.Dirs) != len(ws) {
		st = State{Dirs: make([]int8, len(ws))}
	} else {
		st.Dirs = slices.Clone(st.Dirs)
	}
	target, err := Solve(ws, B)
	if err != nil {
		return nil, st, err
	}
	now, then := Predict(ws, cur), Predict(ws, target)
	gate := p.MinGain
	if !st.Moving {
		gate = max(gate, noise(ws))
	}
	if !changed && !(now-then > gate*now) {
		st.Moving = false
		return slices.Clone(cur), st, nil
	}
	st.Moving = true
	step := 1.0
	if changed {
		st.Halvings = 0
	} else {
		step = p.Damping
		for range st.Halvings {
			step /= 2
		}
	}
	lo, hi, _ := bounds(ws, B) // Solve checked them
	x := make([]float64, len(cur))
	for i := range cur {
		x[i] = float64(cur[i]) + float64(step*float64(target[i]-cur[i]))
	}
	next := roundToSum(x, B, lo, hi)
	flipped := false
	for i := range next {
		d := sign(next[i] - cur[i])
		if d != 0 && st.Dirs[i] == -d {
			flipped = true
		}
		if d != 0 {
			st.Dirs[i] = d
		}
	}
	switch {
	case changed:
	case flipped && st.Halvings < p.MaxHalvings:
		st.Halvings++
	case !flipped && st.Halvings > 0:
		st.Halvings--
	}
	return next, st, nil
}

func sign(v int) int8 {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}

// noise is the largest of the workers' noise: the iteration time, the
// slowest worker's, is as noisy as the noisiest.
func noise(ws []Worker) float64 {
	var n float64
	for _, w := range ws {
		n = max(n, w.Model.noise())
	}
	return n
}
