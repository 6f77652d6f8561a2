package bench

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// DefaultSizes is the default --sizes list of the transport benchmark.
const DefaultSizes = "4K,1M,64M"

// Iteration defaults from the benchmark conventions (docs/benchmarks.md),
// the same as the reference peers'.
const (
	DefaultWarmup = 3
	DefaultRuns   = 5
	// LargeSize is where DefaultIters drops from 20 to 10 timed iterations.
	LargeSize = 16 << 20
)

// ErrBadList is wrapped by every error from ParseSizes and ParseInts.
var ErrBadList = errors.New("bench: bad list")

// DefaultIters returns the number of timed iterations for a message size:
// 20 below 16 MiB and 10 at or above, as the reference peers ($PEERS, see
// README) use.
func DefaultIters(size int64) int {
	if size >= LargeSize {
		return 10
	}
	return 20
}

// ParseSizes parses a comma-separated list of byte counts such as
// "4K,1M,64M". A count is a positive integer with an optional K, M or G
// suffix (either case) meaning 2^10, 2^20 or 2^30, as nccl-tests reads them.
func ParseSizes(list string) ([]int64, error) {
	items, err := splitList(list)
	if err != nil {
		return nil, err
	}
	sizes := make([]int64, 0, len(items))
	for _, it := range items {
		n, err := parseSize(it)
		if err != nil {
			return nil, err
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

func parseSize(s string) (int64, error) {
	mult := int64(1)
	num := s
	switch s[len(s)-1] {
	case 'K', 'k':
		mult, num = 1<<10, s[:len(s)-1]
	case 'M', 'm':
		mult, num = 1<<20, s[:len(s)-1]
	case 'G', 'g':
		mult, num = 1<<30, s[:len(s)-1]
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || num[0] == '+' || num[0] == '-' {
		return 0, fmt.Errorf("%w: size %q: want a positive integer with an optional K, M or G suffix", ErrBadList, s)
	}
	if n <= 0 {
		return 0, fmt.Errorf("%w: size %q must be positive", ErrBadList, s)
	}
	if n > math.MaxInt64/mult {
		return 0, fmt.Errorf("%w: size %q is too large", ErrBadList, s)
	}
	return n * mult, nil
}

// ParseInts parses a comma-separated list of integers in [lo, hi], such as
// the "1,2,4" of --stripes.
func ParseInts(list string, lo, hi int) ([]int, error) {
	items, err := splitList(list)
	if err != nil {
		return nil, err
	}
	out := make([]int, 0, len(items))
	for _, it := range items {
		n, err := strconv.Atoi(it)
		if err != nil {
			return nil, fmt.Errorf("%w: %q is not an integer", ErrBadList, it)
		}
		if n < lo || n > hi {
			return nil, fmt.Errorf("%w: %d is outside [%d, %d]", ErrBadList, n, lo, hi)
		}
		out = append(out, n)
	}
	return out, nil
}

func splitList(list string) ([]string, error) {
	if strings.TrimSpace(list) == "" {
		return nil, fmt.Errorf("%w: empty list", ErrBadList)
	}
	items := strings.Split(list, ",")
	for i, it := range items {
		items[i] = strings.TrimSpace(it)
		if items[i] == "" {
			return nil, fmt.Errorf("%w: empty item in %q", ErrBadList, list)
		}
	}
	return items, nil
}

// FormatSize writes n bytes the way ParseSizes reads them, using the
// largest suffix that divides n exactly.
func FormatSize(n int64) string {
	switch {
	case n >= 1<<30 && n%(1<<30) == 0:
		return strconv.FormatInt(n>>30, 10) + "G"
	case n >= 1<<20 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "M"
	case n >= 1<<10 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "K"
	}
	return strconv.FormatInt(n, 10)
}
