package wire

import (
	"errors"
	"fmt"
)

var (
	// ErrMalformed is wrapped by every error about input that is not a
	// valid frame.
	ErrMalformed = errors.New("wire: malformed frame")
	// ErrTooLarge is wrapped by errors about lengths beyond the limits.
	ErrTooLarge = errors.New("wire: exceeds limit")
	// ErrShortBuffer means a well-formed message did not fit the caller's
	// buffer. The message was consumed and discarded; the stream is intact.
	ErrShortBuffer = errors.New("wire: message larger than buffer")
)

// VersionError reports a frame of another format version.
type VersionError struct{ Got uint8 }

func (e *VersionError) Error() string {
	return fmt.Sprintf("wire: frame version %d, want %d", e.Got, Version)
}

// Is makes a VersionError match ErrMalformed.
func (e *VersionError) Is(target error) bool { return target == ErrMalformed }

// LimitError reports a length beyond a limit.
type LimitError struct {
	What  string // "frame" or "message"
	Got   uint64
	Limit uint64
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("wire: %s of %d bytes exceeds limit of %d", e.What, e.Got, e.Limit)
}

// Is makes a LimitError match ErrTooLarge.
func (e *LimitError) Is(target error) bool { return target == ErrTooLarge }

func tooLarge(what string, got, limit uint64) error {
	return &LimitError{What: what, Got: got, Limit: limit}
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}
