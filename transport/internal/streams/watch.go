package streams

import "context"

// watcher calls onCancel if the context of the call in progress is done
// before the call ends. It is a persistent goroutine per (peer, channel)
// and direction rather than context.AfterFunc, which allocates twice per
// call: Send and Recv must not allocate per message. Calls with a context
// that can never be done skip it.
//
// One goroutine owns a watcher at a time (the sender holding the channel,
// or the single Recv): begin, the watched work, then end.
type watcher struct {
	start    chan context.Context
	stop     chan struct{}
	fired    bool // set by the goroutine before it takes stop; read after end
	onCancel func()
}

func newWatcher(onCancel func()) *watcher {
	return &watcher{
		start:    make(chan context.Context),
		stop:     make(chan struct{}),
		onCancel: onCancel,
	}
}

// run serves begin/end pairs until done is closed.
func (w *watcher) run(done <-chan struct{}) {
	for {
		select {
		case ctx := <-w.start:
			select {
			case <-ctx.Done():
				w.fired = true
				w.onCancel()
				<-w.stop
			case <-w.stop:
			}
		case <-done:
			return
		}
	}
}

// begin starts watching ctx. It returns false if the transport closed.
func (w *watcher) begin(ctx context.Context, done <-chan struct{}) bool {
	w.fired = false
	select {
	case w.start <- ctx:
		return true
	case <-done:
		return false
	}
}

// end stops watching and reports whether onCancel ran. Once it returns,
// onCancel is not running and will not run for this call.
func (w *watcher) end() bool {
	w.stop <- struct{}{}
	return w.fired
}
