// Package integration holds black-box tests that run real gyre processes
// (and the example trainers) through gyretest's process mode: failures
// that must reach every worker, refused credentials, and killed workers.
// It has no code of its own.
//
// GYRE_LONG_TESTS=1 repeats the divergence runs 20 times each; the default
// is 3, for the race-enabled suite.
package integration
