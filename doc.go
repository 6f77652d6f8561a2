// Package gyre is the embedding API of Gyre, a collective-communication
// runtime for data-parallel training with no parameter server.
//
// Workers find each other by gossip, form a ring and allreduce gradients
// over QUIC (or TLS over TCP). This package holds the Config every worker
// is built from. Config documents each field's default, Validate checks it,
// and ConfigFromEnv is the one reader of the GYRE_* environment variables
// that `gyre launch` sets. Library code never reads flags or the
// environment itself: main packages read them and pass them in here.
//
// The worker API (Join, the iteration loop, the sampler) arrives with the
// ring and membership layers; today the package builds the data-plane
// transport from a Config with NewTransport.
package gyre
