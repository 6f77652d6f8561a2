// Package bench holds Gyre's benchmark drivers: the measurement logic behind
// `gyre bench`, kept apart from the command line so it can be tested.
//
// Results follow nccl-tests conventions: sizes in bytes with K/M/G
// suffixes, warm-ups before timed iterations, medians over runs, and
// bandwidth in GB/s of 1e9 bytes per second. A comparison against a
// baseline interleaves runs of the two and quotes the median of the
// per-run ratios, so drift on a shared machine hits both sides alike.
//
// The transport benchmark is in linkbench. bench/RESULTS.md records the
// figures, and the scripts beside it in bench/ drive clusters and
// reference peers.
package bench
