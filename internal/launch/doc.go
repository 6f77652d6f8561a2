// Package launch starts and supervises the local worker processes of a
// job, as `gyre launch` does: one process per worker, output prefixed with
// the worker's launch index (optionally copied to a file per worker), and
// fail-fast: when a worker fails, the others get a grace period to exit on
// their own and report what they saw, then those left are stopped, and
// the failure names the first worker that failed and the rank their
// reports name.
//
// It knows nothing of Gyre's configuration; the caller passes each
// worker's environment in. The launch index is fixed for a worker's life;
// its rank in the job may change after a view change.
package launch
