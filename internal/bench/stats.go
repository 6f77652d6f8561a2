package bench

import (
	"slices"
	"time"
)

// Median returns the median of xs (the mean of the two middle values for
// an even count), or 0 for no values. xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m := len(s) / 2
	if len(s)%2 == 1 {
		return s[m]
	}
	return (s[m-1] + s[m]) / 2
}

// Micros converts durations to microseconds.
func Micros(ds []time.Duration) []float64 {
	out := make([]float64, len(ds))
	for i, d := range ds {
		out[i] = float64(d) / float64(time.Microsecond)
	}
	return out
}

// GBps is the bandwidth of bytes moved in us microseconds, in GB/s of 1e9
// bytes per second as nccl-tests reports it.
func GBps(bytes int64, us float64) float64 {
	if us <= 0 {
		return 0
	}
	return float64(bytes) / us / 1e3
}
