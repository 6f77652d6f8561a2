package gossip

import (
	"errors"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/membership"
)

// metaPublisher gossips this worker's metadata in the background, the
// latest value winning, so a view change never waits on gossip.
type metaPublisher struct {
	node   *membership.Node
	log    zerolog.Logger
	mu     sync.Mutex
	latest *membership.Meta
	kick   chan struct{}
	done   chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
}

func newMetaPublisher(node *membership.Node, log zerolog.Logger) *metaPublisher {
	p := &metaPublisher{node: node, log: log, kick: make(chan struct{}, 1), done: make(chan struct{})}
	p.wg.Add(1)
	go p.run()
	return p
}

// publish gossips m in the background; with no gossip (p nil, the static
// view) it does nothing.
func (p *metaPublisher) publish(m membership.Meta) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.latest = &m
	p.mu.Unlock()
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

func (p *metaPublisher) run() {
	defer p.wg.Done()
	for {
		select {
		case <-p.kick:
		case <-p.done:
			return
		}
		p.mu.Lock()
		m := p.latest
		p.mu.Unlock()
		if err := p.node.UpdateMeta(*m, 2*time.Second); err != nil {
			ev := p.log.Debug() // a broadcast that timed out goes out later
			if errors.Is(err, membership.ErrMeta) {
				ev = p.log.Warn() // it never will: the others see stale metadata
			}
			ev.Err(err).Msg("gossiping metadata")
		}
	}
}

// stop ends publishing; it is idempotent.
func (p *metaPublisher) stop() {
	if p == nil {
		return
	}
	p.once.Do(func() { close(p.done) })
	p.wg.Wait()
}
