// Package launch starts and supervises the local worker processes of a
// job, as `gyre launch` does: one process per rank, output prefixed with
// the rank (optionally copied to a file per rank), and fail-fast: when a
// rank fails, the others are stopped and the failure names the rank.
//
// It knows nothing of Gyre's configuration; the caller passes each rank's
// environment in. Membership will relax fail-fast to "fatal only when the
// job loses its majority"; until then a lost rank ends the job.
package launch
