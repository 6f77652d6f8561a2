//go:build race

package recovery

// raceEnabled: the tests run under the race detector, ten times slower;
// the normal run then explores fewer steps (the long run, without it,
// explores them all).
const raceEnabled = true
