// Package ownfile opens output files that one process alone may write: a
// timeline, a metrics file, saved parameters, a profile. Two workers
// given one path (gyre launch passes every worker the same arguments)
// would interleave their writes and leave a file that no longer parses;
// with an exclusive lock on the file, the second fails at its start
// instead, naming the process that holds it.
//
// The lock is an fcntl record lock over the whole file, which the kernel
// drops when its process exits, however it exits: a worker killed with -9
// and started again takes its file back. It belongs to the process, not
// to the open file, so closing any other descriptor of the same file in
// that process drops it too: write the file through the one Create or
// Open returns.
package ownfile

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Regular reports whether path names a regular file, or nothing yet: a
// file Create would lock.
func Regular(path string) bool {
	fi, err := os.Stat(path)
	return err != nil || fi.Mode().IsRegular()
}

func regular(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode().IsRegular()
}

// HeldError reports a file that another process is writing.
type HeldError struct {
	Path string
	// PID is the process that holds the lock, 0 if it could not be told.
	PID int
}

func (e *HeldError) Error() string {
	holder := "another process"
	if e.PID > 0 {
		holder = fmt.Sprintf("another process (pid %d)", e.PID)
	}
	return fmt.Sprintf("%s is being written by %s: give each process a file of its own", e.Path, holder)
}

// Create opens path for writing by this process alone, creating it if
// needed, and truncates it once the lock is held. A file another process
// holds fails with a *HeldError, and is left as it was. A path that is
// not a regular file (/dev/stdout, /dev/null, a FIFO) is opened as it is,
// neither locked nor truncated: its writers are the user's to arrange.
func Create(path string) (*os.File, error) {
	f, err := Open(path)
	if err != nil {
		return nil, err
	}
	if regular(f) {
		if err := f.Truncate(0); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

// Open is Create without the truncation, for a file written only at the
// end, so that a run that fails first leaves an earlier file whole.
func Open(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	if !regular(f) {
		return f, nil
	}
	whole := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: 0, Len: 0}
	err = unix.FcntlFlock(f.Fd(), unix.F_SETLK, &whole)
	if err == nil {
		return f, nil
	}
	defer f.Close()
	if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	held := &HeldError{Path: path}
	probe := unix.Flock_t{Type: unix.F_WRLCK}
	if unix.FcntlFlock(f.Fd(), unix.F_GETLK, &probe) == nil && probe.Type != unix.F_UNLCK {
		held.PID = int(probe.Pid)
	}
	return nil, held
}
