package gyre_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/gyretest"
)

func newTestTransport(tb testing.TB, adjust func(*gyre.Config)) (transport.Transport, transport.PeerID, string) {
	tb.Helper()
	cfg := gyre.Config{DataAddr: "127.0.0.1:0"}
	adjust(&cfg)
	cfg = cfg.WithDefaults() // fix the random name so the test knows it
	tr, err := gyre.NewTransport(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { tr.Close() })
	return tr, transport.PeerID(cfg.Name), tr.(transport.Listener).Addr()
}

func TestNewTransportExchanges(t *testing.T) {
	key := gyretest.Key(t)
	for _, tt := range []struct {
		name   string
		adjust func(*gyre.Config)
	}{
		{"quic", func(c *gyre.Config) { c.Key = key }},
		{"quic 2 stripes", func(c *gyre.Config) { c.Key = key; c.Stripes = 2 }},
		{"tcp", func(c *gyre.Config) { c.Key = key; c.Transport = gyre.TransportTCP }},
		{"tcp insecure", func(c *gyre.Config) { c.Transport = gyre.TransportTCP; c.Insecure = true }},
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
	for _, tr := range []string{gyre.TransportQUIC, gyre.TransportTCP} {
		t.Run(tr, func(t *testing.T) {
			a, _, _ := newTestTransport(t, func(c *gyre.Config) { c.Transport = tr; c.Key = gyretest.Key(t) })
			_, bID, bAddr := newTestTransport(t, func(c *gyre.Config) { c.Transport = tr; c.Key = gyretest.Key(t) })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := a.Connect(ctx, bID, bAddr); !errors.Is(err, transport.ErrUnauthenticated) {
				t.Fatalf("Connect across secrets = %v, want ErrUnauthenticated", err)
			}
		})
	}
}

func TestNewTransportRejectsBadConfig(t *testing.T) {
	if _, err := gyre.NewTransport(gyre.Config{Listen: "127.0.0.1:0"}); !errors.Is(err, gyre.ErrConfig) {
		t.Fatalf("no secret: %v, want ErrConfig", err)
	}
	if _, err := gyre.NewTransport(gyre.Config{Listen: "127.0.0.1:0", KeyFile: "/nonexistent/key"}); err == nil {
		t.Fatal("missing key file accepted")
	}
}
