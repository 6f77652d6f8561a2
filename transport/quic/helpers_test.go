package quic

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// testCA returns a CA from a fresh secret.
func testCA(tb testing.TB) *secret.CA {
	tb.Helper()
	s, err := secret.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	ca, err := s.CA()
	if err != nil {
		tb.Fatal(err)
	}
	return ca
}

func issue(tb testing.TB, ca *secret.CA, name string) *secret.Identity {
	tb.Helper()
	id, err := ca.Issue(name)
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// newNode starts a transport named id with a leaf from ca on 127.0.0.1,
// with cfg adjusting the defaults, and closes it at the end of the test.
func newNode(tb testing.TB, ca *secret.CA, id string, adjust func(*Config)) *Transport {
	tb.Helper()
	cfg := Config{
		ID:       transport.PeerID(id),
		Identity: issue(tb, ca, id),
		Listen:   "127.0.0.1:0",
	}
	if t, ok := tb.(*testing.T); ok {
		cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	}
	if adjust != nil {
		adjust(&cfg)
	}
	tr, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	return tr
}

// newNodes returns a transporttest.NewNodes that makes nodes sharing one
// cluster secret.
func newNodes(adjust func(*Config)) transporttest.NewNodes {
	return func(tb testing.TB, n int) []transporttest.Node {
		tb.Helper()
		ca := testCA(tb)
		nodes := make([]transporttest.Node, n)
		for i := range nodes {
			id := fmt.Sprintf("node-%d", i)
			tr := newNode(tb, ca, id, adjust)
			nodes[i] = transporttest.Node{ID: transport.PeerID(id), T: tr, Addr: tr.Addr()}
		}
		return nodes
	}
}

// logBuffer is a concurrency-safe zerolog sink for asserting on logs.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
