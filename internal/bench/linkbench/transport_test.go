package linkbench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

// memFactory builds in-process transports: one mem.Network per (variant,
// stripes), so each link of the parent meets the same link of the peer.
func memFactory() TransportFactory {
	var mu sync.Mutex
	nets := map[string]*mem.Network{}
	return func(cfg gyre.Config) (transport.Transport, error) {
		key := fmt.Sprintf("%s/%v/%d", cfg.Transport, cfg.Insecure, cfg.Stripes)
		mu.Lock()
		n := nets[key]
		if n == nil {
			n = mem.NewNetwork(1)
			nets[key] = n
		}
		mu.Unlock()
		return n.Join(transport.PeerID(cfg.Name))
	}
}

// goroutinePeer is a PeerStarter that runs ServePeer in this process,
// reading back the flags PeerSpec.Args wrote.
func goroutinePeer(tb testing.TB, factory TransportFactory) PeerStarter {
	return func(ctx context.Context, args []string, key secret.Secret) (*PeerProcess, error) {
		o := PeerOptions{Links: map[string]string{}, Key: key, NewTransport: factory, Logger: zerolog.New(zerolog.NewTestWriter(tb))}
		var deadline time.Duration
		for i := 0; i+1 < len(args); i += 2 {
			switch args[i] {
			case "--" + FlagLink:
				k, v, _ := strings.Cut(args[i+1], "=")
				o.Links[k] = v
			case "--" + FlagBare:
				o.Bare = append(o.Bare, args[i+1])
			case "--" + FlagDeadline:
				deadline, _ = time.ParseDuration(args[i+1])
			default:
				return nil, fmt.Errorf("unexpected peer flag %q", args[i])
			}
		}
		if deadline <= 0 {
			return nil, fmt.Errorf("no deadline in %q", args)
		}
		inR, inW := io.Pipe()
		outR, outW := io.Pipe()
		pctx, cancel := context.WithTimeout(context.Background(), deadline)
		done := make(chan error, 1)
		go func() {
			err := ServePeer(pctx, o, inR, outW)
			outW.CloseWithError(io.EOF)
			inR.Close()
			done <- err
		}()
		return &PeerProcess{
			Stdout: outR,
			Stdin:  inW,
			Wait:   func() error { defer cancel(); return <-done },
			Kill:   cancel,
		}, nil
	}
}

func testOptions(tb testing.TB, variants ...Variant) TransportOptions {
	tb.Helper()
	key, err := secret.Generate()
	if err != nil {
		tb.Fatal(err)
	}
	return TransportOptions{
		Variants:     variants,
		Stripes:      []int{1, 2},
		Sizes:        []int64{4 << 10, wire.StripeMin + 3},
		Warmup:       1,
		Iters:        3,
		Runs:         2,
		Key:          key,
		NewTransport: memFactory(),
		Command:      "test",
		Logger:       zerolog.New(zerolog.NewTestWriter(tb)),
	}
}

// TestRunTransportInProcess drives the whole protocol with the peer in a
// goroutine: Gyre links over mem, the baselines over real loopback
// connections of every kind.
func TestRunTransportInProcess(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := testOptions(t, VariantQUIC, VariantTLS, VariantTCPInsecure)
	rep, err := RunTransport(ctx, o, goroutinePeer(t, o.NewTransport))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.OneWay), 3*2*2; got != want {
		t.Fatalf("%d one-way rows, want %d", got, want)
	}
	if got, want := len(rep.RoundTrip), 3*2; got != want {
		t.Fatalf("%d round-trip rows, want %d", got, want)
	}
	for _, r := range rep.OneWay {
		if r.GBps <= 0 || r.BareGBps <= 0 || r.Ratio <= 0 || len(r.Runs) != 2 || r.Iters != 3 {
			t.Errorf("bad one-way row %+v", r)
		}
	}
	for _, r := range rep.RoundTrip {
		if r.RTTUS <= 0 || r.BareRTTUS <= 0 || r.Ratio <= 0 || r.SizeBytes != RTTSize {
			t.Errorf("bad round-trip row %+v", r)
		}
	}
	if !strings.Contains(rep.OneWay[0].Bare, "quic-go") {
		t.Errorf("first baseline = %q", rep.OneWay[0].Bare)
	}
}

// TestRunTransportBidir runs the bidirectional trial the same way: every
// row has both sides' figures, and the parent has checked the bytes it got
// back (a mismatch fails the run), across stripes and sizes that split.
func TestRunTransportBidir(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := testOptions(t, VariantQUIC, VariantTLS, VariantTCPInsecure)
	o.Bidir = true
	rep, err := RunTransport(ctx, o, goroutinePeer(t, o.NewTransport))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(rep.OneWay), 3*2*2; got != want {
		t.Fatalf("%d bidir rows, want %d", got, want)
	}
	if len(rep.RoundTrip) != 0 || !rep.Settings.Bidir {
		t.Fatalf("bidir report: %d round-trip rows, settings %+v", len(rep.RoundTrip), rep.Settings)
	}
	for _, r := range rep.OneWay {
		if !r.Bidir || r.GBps <= 0 || r.BareGBps <= 0 || r.Ratio <= 0 || len(r.Runs) != 2 || r.Iters != 3 {
			t.Errorf("bad bidir row %+v", r)
		}
	}
}

func TestDuplexAborts(t *testing.T) {
	boom := errors.New("boom")
	unblock := make(chan struct{})
	err := duplex(func() { close(unblock) },
		func() error { <-unblock; return context.Canceled },
		func() error { return boom })
	if !errors.Is(err, boom) || !errors.Is(err, context.Canceled) {
		t.Fatalf("duplex = %v, want both errors", err)
	}
}

// TestPeerStops checks the peer exits cleanly when the parent
// closes its stdin, and fails when its deadline passes first.
func TestPeerStops(t *testing.T) {
	key, err := secret.Generate()
	if err != nil {
		t.Fatal(err)
	}
	o := PeerOptions{Bare: []string{"tcp"}, Key: key, Logger: zerolog.New(zerolog.NewTestWriter(t))}

	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServePeer(context.Background(), o, inR, outW) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := readHello(ctx, outR)
	if err != nil {
		t.Fatal(err)
	}
	if h.Bare[BareTCP] == "" {
		t.Fatalf("hello %+v lacks the tcp baseline", h)
	}
	inW.Close()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("peer after stdin closed: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("peer did not stop when stdin closed")
	}

	inR, inW = io.Pipe()
	defer inW.Close()
	dctx, dcancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer dcancel()
	if err := ServePeer(dctx, o, inR, io.Discard); err == nil {
		t.Fatal("peer past its deadline returned nil")
	}
}

func TestRunTransportRejectsOptions(t *testing.T) {
	o := testOptions(t, VariantQUIC)
	o.Runs = -1
	o.Stripes = []int{0}
	o.Key = secret.Secret{}
	_, err := RunTransport(context.Background(), o, func(context.Context, []string, secret.Secret) (*PeerProcess, error) {
		t.Fatal("a peer was started for invalid options")
		return nil, nil
	})
	for _, want := range []string{"runs -1", "stripes 0", "no cluster secret"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %q", err, want)
		}
	}
}

// countingConn counts the bytes that cross a bare connection each way and,
// if corrupt, flips the first byte of every read but the first (the ready
// answer).
type countingConn struct {
	conn
	read, written int
	corrupt       bool
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.conn.Read(p)
	if c.corrupt && n > 0 && c.read > 0 {
		p[0] ^= 0xff
	}
	c.read += n
	return n, err
}

func (c *countingConn) Write(p []byte) (int, error) {
	n, err := c.conn.Write(p)
	c.written += n
	return n, err
}

// TestBareBidirOneConnectionPerDirection checks the bare bidir trial's
// layout, for every kind of baseline: per stripe, the parent's bytes go
// out on one connection and the peer's come back on another, as each side
// of a Gyre transport sends on connections of its own. It also checks that
// a corrupted byte from the peer fails the trial.
func TestBareBidirOneConnectionPerDirection(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	key, err := secret.Generate()
	if err != nil {
		t.Fatal(err)
	}
	peerIdent, err := identity(key, peerID)
	if err != nil {
		t.Fatal(err)
	}
	parentIdent, err := identity(key, parentID)
	if err != nil {
		t.Fatal(err)
	}
	const stripes, count = 2, 3
	msg := fillMessage(make([]byte, 2*wire.StripeMin+5))
	for _, kind := range []BareKind{BareQUIC, BareTLS, BareTCP} {
		t.Run(string(kind), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := listenBare(kind, peerIdent)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			defer wg.Wait()
			defer l.close()
			defer cancel()
			wg.Go(func() {
				for {
					open, err := l.accept(ctx)
					if err != nil {
						return
					}
					wg.Go(func() {
						if c, err := open(ctx); err == nil {
							serveBare(ctx, c)
						}
					})
				}
			})
			b, err := dialBareLink(ctx, kind, l.addr(), stripes, true, parentIdent)
			if err != nil {
				t.Fatal(err)
			}
			defer b.close()
			if len(b.conns) != stripes || len(b.back) != stripes {
				t.Fatalf("%d + %d connections, want %d each way", len(b.conns), len(b.back), stripes)
			}
			out := make([]*countingConn, stripes)
			back := make([]*countingConn, stripes)
			for i := range stripes {
				out[i] = &countingConn{conn: b.conns[i]}
				back[i] = &countingConn{conn: b.back[i]}
				b.conns[i], b.back[i] = out[i], back[i]
			}
			if _, err := b.bidir(ctx, msg, count); err != nil {
				t.Fatal(err)
			}
			for i := range stripes {
				lo, hi := wire.StripePart(uint64(len(msg)), stripes, i)
				payload := count * int(hi-lo)
				// Out: command and payload out, ready and ack in. Back:
				// command and go out, ready and payload in.
				if out[i].written != cmdSize+payload || out[i].read != 2 {
					t.Errorf("stripe %d out: wrote %d, read %d; want %d, 2", i, out[i].written, out[i].read, cmdSize+payload)
				}
				if back[i].written != cmdSize+1 || back[i].read != 1+payload {
					t.Errorf("stripe %d back: wrote %d, read %d; want %d, %d", i, back[i].written, back[i].read, cmdSize+1, 1+payload)
				}
			}

			back[1].read, back[1].corrupt = 0, true
			if _, err := b.bidir(ctx, msg, count); !errors.Is(err, ErrProtocol) {
				t.Fatalf("bidir with a corrupted byte = %v, want %v", err, ErrProtocol)
			}
			back[1].corrupt = false
			if err := b.release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
