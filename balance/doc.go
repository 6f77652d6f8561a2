// Package balance decides per-worker batch shares from measured compute
// times, after LB-BSP (Chen et al., SoCC 2020): the global batch B stays
// fixed, and each worker gets a share that makes all of them finish their
// compute at about the same time, so a slow or busy worker no longer holds
// the others back.
//
// It is pure: no clocks, sockets or goroutines, inputs in and shares out.
//
//   - An Estimator runs on each worker over its own recent iterations
//     (samples, compute seconds) and fits c(b) = a + b/v by
//     recency-weighted least squares, keeping a only when it is
//     significant, with a change detector that forgets the history when
//     the worker slows down or speeds up sharply and holds runs of slow
//     iterations (spikes, bursts of preemption) out of the fit. A
//     slow-down counts only once its iterations span several CFS quota
//     periods of predicted time, and a speed-up only in iterations
//     predicted to last that long, which a quota cannot make run at full
//     speed. A duty, averaged over a second or more, charges shorter
//     slow runs (not single spikes) to the worker, so that its model is
//     its mean speed, and the noise says how uncertain that model is. Its Model, noise
//     included, is quantised to integers, so that the models every
//     worker publishes are exact.
//   - Solve is the decision every worker takes from the same table of
//     models and bounds: it minimises the predicted iteration time
//     max cᵢ(bᵢ) subject to Σbᵢ = B and minᵢ ≤ bᵢ ≤ maxᵢ, by water-filling,
//     then rounds by largest remainder so that the sum stays exactly B. It
//     uses only IEEE-rounded float64 operations on integer inputs, so every
//     worker, whatever its CPU, derives the same shares.
//   - Step damps Solve's moves: it moves part of the way, keeps the shares
//     until the predicted gain exceeds the workers' noise, halves its
//     step when shares oscillate and restores it as they stop, and jumps
//     at once when a worker changed speed.
package balance
