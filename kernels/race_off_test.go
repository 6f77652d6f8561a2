//go:build !race

package kernels

// largeLength is the large odd length the kernels are checked at.
const largeLength = 1000003
