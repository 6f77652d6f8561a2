package transport

import (
	"context"
	"time"
)

// pollKey is the context key of WithPoll.
type pollKey struct{}

// WithPoll returns a context under which a Recv that finds no message
// waiting may poll for one for up to d before it sleeps, for a message
// expected within microseconds, such as the answer in a small
// collective. Sleeping costs a wake-up when the message comes, which on
// a virtual machine whose core went idle is tens of microseconds; polling
// costs the core it runs on. Transports that cannot poll (QUIC, the
// in-memory one) ignore it. The context ends as ctx does.
func WithPoll(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, pollKey{}, d)
}

// PollFrom returns the poll duration WithPoll put in ctx, or 0.
func PollFrom(ctx context.Context) time.Duration {
	d, _ := ctx.Value(pollKey{}).(time.Duration)
	return d
}
