package gyre

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

func newTestTransport(tb testing.TB, adjust func(*Config)) (transport.Transport, transport.PeerID, string) {
	tb.Helper()
	cfg := Config{DataAddr: "127.0.0.1:0"}
	adjust(&cfg)
	cfg = cfg.WithDefaults() // fix the random name so the test knows it
	tr, err := NewTransport(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	return tr, transport.PeerID(cfg.Name), tr.(transport.Listener).Addr()
}

func TestNewTransportExchanges(t *testing.T) {
	key := testKey(t)
	for _, tt := range []struct {
		name   string
		adjust func(*Config)
	}{
		{"quic", func(c *Config) { c.Key = key }},
		{"quic 2 stripes", func(c *Config) { c.Key = key; c.Stripes = 2 }},
		{"tcp", func(c *Config) { c.Key = key; c.Transport = TransportTCP }},
		{"tcp insecure", func(c *Config) { c.Transport = TransportTCP; c.Insecure = true }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a, aID, _ := newTestTransport(t, tt.adjust)
			b, bID, bAddr := newTestTransport(t, tt.adjust)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := a.Connect(ctx, bID, bAddr); err != nil {
				t.Fatal(err)
			}
			msg := bytes.Repeat([]byte("gyre"), 1<<18) // 1 MiB: striped when Stripes > 1
			if err := a.Send(ctx, bID, transport.ChanData, wire.Header{Kind: wire.KindData, Seq: 7}, msg); err != nil {
				t.Fatal(err)
			}
			buf := make([]byte, len(msg))
			h, n, err := b.Recv(ctx, aID, transport.ChanData, buf)
			if err != nil || h.Seq != 7 || !bytes.Equal(buf[:n], msg) {
				t.Fatalf("Recv = %+v, %d bytes, %v", h, n, err)
			}
		})
	}
}

func TestNewTransportRefusesOtherSecret(t *testing.T) {
	for _, tr := range []string{TransportQUIC, TransportTCP} {
		t.Run(tr, func(t *testing.T) {
			a, _, _ := newTestTransport(t, func(c *Config) { c.Transport = tr; c.Key = testKey(t) })
			_, bID, bAddr := newTestTransport(t, func(c *Config) { c.Transport = tr; c.Key = testKey(t) })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := a.Connect(ctx, bID, bAddr); !errors.Is(err, transport.ErrUnauthenticated) {
				t.Fatalf("Connect across secrets = %v, want ErrUnauthenticated", err)
			}
		})
	}
}

func TestNewTransportRejectsBadConfig(t *testing.T) {
	if _, err := NewTransport(Config{Listen: "127.0.0.1:0"}); !errors.Is(err, ErrConfig) {
		t.Fatalf("no secret: %v, want ErrConfig", err)
	}
	if _, err := NewTransport(Config{Listen: "127.0.0.1:0", KeyFile: "/nonexistent/key"}); err == nil {
		t.Fatal("missing key file accepted")
	}
}
