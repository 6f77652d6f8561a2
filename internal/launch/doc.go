// Package launch starts and supervises the local worker processes of a
// job, as `gyre launch` does: one process per worker, output prefixed with
// the worker's launch index (optionally copied to a file per worker).
//
// A worker that fails is lost, and the others go on without it, as the
// runtime's recovery lets them. The job ends when every worker has exited,
// or when one exits with the no-quorum status (the job lost its majority;
// then the others are stopped: SIGTERM, SIGKILL after a grace period). It
// finished if a worker exited 0 and none with the no-quorum status; the
// result names the lost workers. Otherwise it failed, and the error names
// the worker that ended it and the rank the failed workers' reports name.
//
// It knows nothing of Gyre's configuration; the caller passes each
// worker's environment, and the no-quorum status, in. The launch index is
// fixed for a worker's life; its rank in the job may change after a view
// change.
package launch
