package balance

import "slices"

// Params tune Step. The zero value means the defaults.
type Params struct {
	// Damping is the fraction of the way to Solve's shares that one step
	// moves. Default 0.5.
	Damping float64
	// MinGain is the smallest predicted reduction of the iteration time,
	// relative, for which the shares change at all. Default 0.02.
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
// must hold the same State: each starts from the zero value at every
// view change, a joiner with them.
type State struct {
	// Halvings is how often oscillation has halved the step.
	Halvings int
	// Dirs is each worker's last move: -1, 0 or +1.
	Dirs []int8
}

// Step returns the next shares from the current ones: Solve's shares if
// some worker changed speed (changed, from Estimator.Add), else Damping
// (halved Halvings times) of the way towards them, or the current ones
// if Solve predicts a gain below the largest noise of the workers'
// models (Model.NoisePpm; MinGain if larger): such a gain may be the
// models' error, and each move costs the trainers their buffers. A
// worker whose share moves against its previous move halves the step
// for the ones after; a move in which no share reverses undoes one
// halving, so that the early noise of a young fit does not leave the
// shares creeping for the rest of the run. cur must meet the bounds and
// sum to B.
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
	if !changed && !(now-then > max(p.MinGain, noise(ws, cur))*now) {
		return slices.Clone(cur), st, nil
	}
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

// noise is the largest noise of the workers with samples: the
// predicted iteration time, the slowest worker's, is as uncertain as the
// most uncertain. A worker without samples measures nothing, and its
// noise stays as it was.
func noise(ws []Worker, cur []int) float64 {
	var n float64
	for i, w := range ws {
		if cur[i] > 0 {
			n = max(n, w.Model.noise())
		}
	}
	return n
}
