//go:build race

package kernels

// largeLength under the race detector, which makes every element of the
// tests' loops costly: like 1000003 it is odd, leaves a remainder after
// each unrolled loop (gonum's 16-, 4- and 1-wide float32 loops, its 8-,
// 2- and 1-wide float64 ones, sumLoop's 8), and splits into 12 uneven
// ranges on the tests' 3-proc pool, whose last range does too.
const largeLength = 10007
