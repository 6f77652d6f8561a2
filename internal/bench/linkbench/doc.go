// Package linkbench is the transport benchmark behind `gyre bench
// transport`. It runs two processes: RunTransport in the parent and
// ServePeer in a child it starts through a PeerStarter. Each Gyre
// transport variant is paired with a bare baseline that carries the same
// bytes with no Gyre framing, and the report gives Gyre's bandwidth and
// round trip as ratios of the baseline's, the medians of per-run ratios
// (package bench's conventions).
package linkbench
