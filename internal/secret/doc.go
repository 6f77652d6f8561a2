// Package secret turns the cluster secret into Gyre's keys and certificates.
//
// One 32-byte secret, made by `gyre keygen` and shared by every process of a
// job, is stretched with HKDF-SHA256 into independent keys:
//   - the memberlist gossip encryption key (GossipKey);
//   - the seed of an Ed25519 cluster CA (CA). Every process derives the same
//     CA, and mints its own short-lived leaf certificate from it at start.
//
// Both data-plane transports require mutual TLS 1.3 with leaves chained to
// that CA, so a process without the secret can neither connect nor accept.
// Nothing here reads flags or the environment; callers pass paths in.
package secret
