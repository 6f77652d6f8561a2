// Command gyre is Gyre's command line: cluster keys (keygen), local jobs
// (launch), the built-in training job (train), gossip membership
// (members) and benchmarks (bench transport, allreduce, overlap, gossip).
//
// It is the one place that reads flags and GYRE_* environment variables
// (through gyre.ConfigFromEnv) and passes what it read into the library
// packages. Each subcommand lives in its own file.
package main
