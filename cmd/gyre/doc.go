// Command gyre is Gyre's command line: cluster keys, benchmarks and, as
// the later layers land, training, launching and membership.
//
// It is the one place that reads flags and GYRE_* environment variables
// (through gyre.ConfigFromEnv) and passes what it read into the library
// packages. Each subcommand lives in its own file.
package main
