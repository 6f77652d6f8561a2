package linkbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre"
	"github.com/gyre-ml/gyre/internal/bench"
	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/internal/syncio"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// RTTSize is the message size of the round-trip measurement.
const RTTSize = 4 << 10

// stopTimeout bounds how long the parent waits for the peer to exit after
// closing its stdin, before it kills it.
const stopTimeout = 10 * time.Second

// TransportOptions configure RunTransport. Zero values take the defaults
// noted on each field.
type TransportOptions struct {
	Variants []Variant // required
	Stripes  []int     // default [1]
	Sizes    []int64   // default bench.DefaultSizes
	Warmup   int       // untimed messages before the runs of each size and round trip; 0 for none
	Iters    int       // timed messages per run; 0: bench.DefaultIters(size)
	Runs     int       // interleaved runs of gyre and bare; default bench.DefaultRuns
	// Bidir measures both processes sending to each other at once, a
	// two-rank ring's traffic, instead of one-way throughput and the
	// round trip.
	Bidir bool

	Key          secret.Secret    // the ephemeral cluster secret shared with the peer; required
	NewTransport TransportFactory // default gyre.NewTransport
	Command      string           // the command line, for the report
	Logger       zerolog.Logger   // progress, one line per row
}

func (o TransportOptions) withDefaults() (TransportOptions, error) {
	if len(o.Stripes) == 0 {
		o.Stripes = []int{1}
	}
	if len(o.Sizes) == 0 {
		o.Sizes, _ = bench.ParseSizes(bench.DefaultSizes)
	}
	if o.Runs == 0 {
		o.Runs = bench.DefaultRuns
	}
	o.Warmup = max(o.Warmup, 0)
	if o.NewTransport == nil {
		o.NewTransport = gyre.NewTransport
	}
	var errs []error
	if len(o.Variants) == 0 {
		errs = append(errs, errors.New("no transport variant selected"))
	}
	for _, s := range o.Stripes {
		if s < 1 || s > gyre.MaxStripes {
			errs = append(errs, fmt.Errorf("stripes %d: want 1 to %d", s, gyre.MaxStripes))
		}
	}
	for _, s := range o.Sizes {
		if s < 1 || s > MaxMessage {
			errs = append(errs, fmt.Errorf("size %d: want 1 to %d bytes", s, MaxMessage))
		}
	}
	if o.Iters < 0 {
		errs = append(errs, fmt.Errorf("iters %d: want 0 (the default) or more", o.Iters))
	}
	if o.Runs < 1 {
		errs = append(errs, fmt.Errorf("runs %d: want 1 or more", o.Runs))
	}
	if o.Key.IsZero() {
		errs = append(errs, errors.New("no cluster secret"))
	}
	if err := errors.Join(errs...); err != nil {
		return o, fmt.Errorf("bench: %w", err)
	}
	return o, nil
}

func (o TransportOptions) iters(size int64) int {
	if o.Iters > 0 {
		return o.Iters
	}
	return bench.DefaultIters(size)
}

// PeerProcess is a started peer.
type PeerProcess struct {
	Stdout io.Reader      // the peer's hello line arrives here
	Stdin  io.WriteCloser // closing it tells the peer to stop
	Wait   func() error   // waits for the peer to exit; called once
	Kill   func()         // ends the peer at once
}

// PeerStarter starts the peer side with the given flags (PeerSpec.Args)
// and hands it the secret without putting it on a command line.
type PeerStarter func(ctx context.Context, args []string, key secret.Secret) (*PeerProcess, error)

// ExecPeer returns a PeerStarter that runs exe with prefix followed by the
// peer's flags. The child's environment is env plus GYRE_KEY holding the
// secret, so the secret never shows in a process listing; env should carry
// no other GYRE_KEY or GYRE_KEY_FILE. The child's stderr (its logs) goes to
// stderr, one write at a time however many children run. The child is
// killed if ctx ends.
func ExecPeer(exe string, prefix, env []string, stderr io.Writer) PeerStarter {
	stderr = syncio.NewWriter(stderr)
	return func(ctx context.Context, args []string, key secret.Secret) (*PeerProcess, error) {
		cmd := exec.CommandContext(ctx, exe, append(append([]string(nil), prefix...), args...)...)
		cmd.Env = append(append([]string(nil), env...), gyre.EnvKey+"="+key.Hex())
		cmd.Stderr = stderr
		cmd.WaitDelay = stopTimeout
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("bench: start peer: %w", err)
		}
		return &PeerProcess{
			Stdout: out,
			Stdin:  in,
			Wait:   cmd.Wait,
			Kill:   func() { cmd.Process.Kill() },
		}, nil
	}
}

// StopPeer closes the peer's stdin and waits for it to exit, killing it
// if it has not within stopTimeout. The peer never outlives the parent.
func StopPeer(p *PeerProcess) error {
	p.Stdin.Close()
	done := make(chan error, 1)
	go func() { done <- p.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(stopTimeout):
		p.Kill()
		return fmt.Errorf("bench: the peer did not stop in time and was killed (%v)", <-done)
	}
}

// readHello waits for the peer's hello line.
func readHello(ctx context.Context, r io.Reader) (PeerHello, error) {
	type result struct {
		line string
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 4096), 64<<10)
		if sc.Scan() {
			ch <- result{line: sc.Text()}
			return
		}
		err := sc.Err()
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		ch <- result{err: fmt.Errorf("bench: the peer exited before it was ready (see its log above): %w", err)}
	}()
	ctx, cancel := context.WithTimeout(ctx, 2*connectTimeout)
	defer cancel()
	select {
	case res := <-ch:
		if res.err != nil {
			return PeerHello{}, res.err
		}
		return parseHello(res.line)
	case <-ctx.Done():
		return PeerHello{}, fmt.Errorf("bench: waiting for the peer to start: %w", ctx.Err())
	}
}

// RunTransport measures every selected variant against its baseline with
// a peer started by start, and returns the report. Everything it starts
// is stopped before it returns.
func RunTransport(ctx context.Context, o TransportOptions, start PeerStarter) (rep *Report, err error) {
	o, err = o.withDefaults()
	if err != nil {
		return nil, err
	}
	log := o.Logger

	// The parent's links listen first, so the peer can connect back.
	links := map[string]*gyreLink{}
	defer func() {
		for _, l := range links {
			l.t.Close()
		}
	}()
	spec := PeerSpec{Links: map[string]string{}, Deadline: 24 * time.Hour}
	if dl, ok := ctx.Deadline(); ok {
		spec.Deadline = time.Until(dl).Round(time.Second) + stopTimeout
	}
	for _, v := range o.Variants {
		for _, s := range o.Stripes {
			key := linkKey(v, s)
			t, addr, err := openLink(ctx, o.NewTransport, key, parentID, o.Key, log)
			if err != nil {
				return nil, err
			}
			links[key] = &gyreLink{t: t}
			spec.Links[key] = addr
		}
		spec.Bare = append(spec.Bare, v.Bare())
	}
	id, err := identity(o.Key, parentID)
	if err != nil {
		return nil, err
	}

	proc, err := start(ctx, spec.Args(), o.Key)
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := StopPeer(proc); serr != nil && err == nil {
			err = fmt.Errorf("bench: peer: %w", serr)
		}
	}()
	hello, err := readHello(ctx, proc.Stdout)
	if err != nil {
		return nil, err
	}
	for key, l := range links {
		addr, ok := hello.Links[key]
		if !ok {
			return nil, fmt.Errorf("%w: the peer has no link %s", ErrProtocol, key)
		}
		cctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := l.t.Connect(cctx, peerID, addr)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("bench: link %s: connect to the peer at %s: %w", key, addr, err)
		}
	}

	rep = &Report{
		Command: o.Command,
		Date:    time.Now(),
		Machine: bench.ThisMachine(),
		Settings: Settings{
			Stripes: o.Stripes, Sizes: o.Sizes, Warmup: o.Warmup, Iters: o.Iters, Runs: o.Runs,
			Bidir: o.Bidir,
		},
		Method: method(o.Bidir),
	}
	var maxSize int64 = RTTSize
	for _, s := range o.Sizes {
		maxSize = max(maxSize, s)
	}
	buf := fillMessage(make([]byte, maxSize))

	for _, v := range o.Variants {
		rep.Settings.Variants = append(rep.Settings.Variants, v.String())
		for _, s := range o.Stripes {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			g := links[linkKey(v, s)]
			b, err := dialBareLink(ctx, v.Bare(), hello.Bare[v.Bare()], s, o.Bidir, id)
			if err != nil {
				return nil, err
			}
			err = measure(ctx, o, rep, v, s, g, b, buf)
			b.close()
			if err != nil {
				return nil, fmt.Errorf("bench: %s stripes %d: %w", v, s, err)
			}
		}
	}
	return rep, nil
}

// method says how the report was measured, for its header.
func method(bidir bool) []string {
	m := []string{
		"two processes on 127.0.0.1; gyre = the Gyre transport (framing, channels, stripes); bare = the same bytes with no Gyre framing",
		"bare baselines: quic -> one quic-go stream per connection (same certificates, same flow-control windows); tcp -> crypto/tls 1.3; tcp-insecure -> plain TCP; one connection per stripe, each carrying an equal slice of every message of 256K or more, as Gyre splits them",
	}
	if bidir {
		return append(m,
			"bidir: both processes send iters messages of size_bytes to each other at once (a two-rank ring's traffic); the clock runs from the parent's go to when both hold the other's last byte; time_us = elapsed / iters",
			"bidir bare: one connection per direction and stripe, as Gyre sends each direction on connections of its own: the parent's slices go out on one set, the peer's come back on another (the parent dials both; quic: from one socket)",
			"GB/s is per direction: size_bytes one side sent / time_us, comparable with an N=2 allreduce's busbw; the received bytes are checked",
			"medians over runs; ratio = median over runs of gyre/bare GB/s (below 1 is slower); GB/s = 1e9 bytes/s",
		)
	}
	return append(m,
		"one-way: the sender starts the clock, sends iters messages of size_bytes back to back and stops it when the receiver acks the last byte; time_us = elapsed / iters",
		fmt.Sprintf("round trip: %d-byte ping-pong, each exchange timed alone, median per run; the bare round trip uses one connection", RTTSize),
		"medians over runs; ratio = median over runs of gyre/bare (one-way: GB/s, below 1 is slower; round trip: time, above 1 is slower); GB/s = 1e9 bytes/s",
	)
}

// measure runs every size, and the round trip unless o.Bidir, for one
// variant and stripe count, appending rows to rep.
func measure(ctx context.Context, o TransportOptions, rep *Report, v Variant, stripes int, g *gyreLink, b *bareLink, buf []byte) error {
	log := o.Logger.With().Str("variant", v.String()).Int("stripes", stripes).Logger()
	sides := []struct {
		name string
		l    link
	}{{"gyre", g}, {"bare", b}}
	for _, size := range o.Sizes {
		msg := buf[:size]
		iters := o.iters(size)
		if o.Warmup > 0 {
			for _, side := range sides {
				if _, err := o.throughput(ctx, side.l, msg, o.Warmup); err != nil {
					return fmt.Errorf("%s warm-up at %d bytes: %w", side.name, size, err)
				}
			}
		}
		runs := make([]Pair, o.Runs)
		for r := range runs {
			var us [2]float64
			for i, side := range sides {
				d, err := o.throughput(ctx, side.l, msg, iters)
				if err != nil {
					return fmt.Errorf("%s %s at %d bytes: %w", side.name, o.mode(), size, err)
				}
				us[i] = float64(d) / float64(time.Microsecond) / float64(iters)
			}
			runs[r] = Pair{GyreUS: us[0], BareUS: us[1]}
		}
		row := newOneWay(v.String(), v.Bare().Describe(), stripes, size, iters, runs)
		row.Bidir = o.Bidir
		rep.OneWay = append(rep.OneWay, row)
		log.Info().Int64("size", size).Float64("gbps", row.GBps).Float64("bare_gbps", row.BareGBps).
			Float64("ratio", row.Ratio).Msg(o.mode())
	}
	// The round trip is the same exchange with or without bidir, so a bidir
	// run leaves it out.
	if !o.Bidir {
		iters := o.iters(RTTSize)
		msg := buf[:RTTSize]
		runs := make([]Pair, o.Runs)
		for r := range runs {
			var us [2]float64
			for i, side := range sides {
				ds, err := timedPingPong(ctx, side.l, msg, o.Warmup, iters)
				if err != nil {
					return fmt.Errorf("%s round trip: %w", side.name, err)
				}
				us[i] = bench.Median(bench.Micros(ds))
			}
			runs[r] = Pair{GyreUS: us[0], BareUS: us[1]}
		}
		row := newRTT(v.String(), v.Bare().Describe(), stripes, RTTSize, iters, runs)
		rep.RoundTrip = append(rep.RoundTrip, row)
		log.Info().Float64("rtt_us", row.RTTUS).Float64("bare_rtt_us", row.BareRTTUS).Float64("ratio", row.Ratio).Msg("round trip")
	}

	for _, side := range sides {
		rctx, cancel := context.WithTimeout(ctx, connectTimeout)
		err := side.l.release(rctx)
		cancel()
		if err != nil {
			return fmt.Errorf("%s release: %w", side.name, err)
		}
	}
	return nil
}

// trialTimeout bounds one trial moving n bytes: generous, since it only
// guards against a hang, at a floor of 10 MB/s.
func trialTimeout(n int64) time.Duration {
	return connectTimeout + time.Duration(n/10e6)*time.Second
}

// timedPingPong runs warm+iters exchanges and returns the last iters.
func timedPingPong(ctx context.Context, l link, msg []byte, warm, iters int) ([]time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, trialTimeout(2*int64(len(msg))*int64(warm+iters)))
	defer cancel()
	ds, err := l.pingPong(ctx, msg, warm+iters)
	if err != nil {
		return nil, err
	}
	return ds[warm:], nil
}

// link is one side of a comparison, as the parent drives it.
type link interface {
	// oneWay sends count messages of msg and returns the time from the
	// first send to the peer's ack of the last byte.
	oneWay(ctx context.Context, msg []byte, count int) (time.Duration, error)
	// bidir sends count messages of msg while the peer sends as many of
	// the same size back, and returns the time until both hold all of them.
	bidir(ctx context.Context, msg []byte, count int) (time.Duration, error)
	// pingPong exchanges msg with the peer count times, timing each.
	pingPong(ctx context.Context, msg []byte, count int) ([]time.Duration, error)
	// release lets the peer free its buffer.
	release(ctx context.Context) error
}

// gyreLink drives a Gyre transport connected to the peer.
type gyreLink struct {
	t    transport.Transport
	rbuf []byte
}

// command sends c and waits for the peer to be ready.
func (g *gyreLink) command(ctx context.Context, c command) error {
	if err := g.t.Send(ctx, peerID, transport.ChanControl, c.header(), nil); err != nil {
		return err
	}
	return g.expect(ctx, opReady)
}

func (g *gyreLink) expect(ctx context.Context, op uint32) error {
	var cb [64]byte
	h, _, err := g.t.Recv(ctx, peerID, transport.ChanControl, cb[:])
	if err != nil {
		return err
	}
	if h.Step != op {
		return fmt.Errorf("%w: got op %d, want %d", ErrProtocol, h.Step, op)
	}
	return nil
}

func (g *gyreLink) oneWay(ctx context.Context, msg []byte, count int) (time.Duration, error) {
	if err := g.command(ctx, command{op: opOneWay, size: uint64(len(msg)), count: uint32(count)}); err != nil {
		return 0, err
	}
	t0 := time.Now()
	for range count {
		if err := g.t.Send(ctx, peerID, transport.ChanData, dataHeader, msg); err != nil {
			return 0, err
		}
	}
	if err := g.expect(ctx, opAck); err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func (g *gyreLink) pingPong(ctx context.Context, msg []byte, count int) ([]time.Duration, error) {
	if err := g.command(ctx, command{op: opPingPong, size: uint64(len(msg)), count: uint32(count)}); err != nil {
		return nil, err
	}
	g.rbuf = grow(g.rbuf, len(msg))
	ds := make([]time.Duration, count)
	for i := range ds {
		t0 := time.Now()
		if err := g.t.Send(ctx, peerID, transport.ChanData, dataHeader, msg); err != nil {
			return nil, err
		}
		_, n, err := g.t.Recv(ctx, peerID, transport.ChanData, g.rbuf)
		if err != nil {
			return nil, err
		}
		ds[i] = time.Since(t0)
		if n != len(msg) {
			return nil, fmt.Errorf("%w: echo of %d bytes, want %d", ErrProtocol, n, len(msg))
		}
	}
	return ds, nil
}

func (g *gyreLink) release(ctx context.Context) error {
	return g.command(ctx, command{op: opRelease})
}

// bareLink drives the baseline: one bare connection per stripe, each
// carrying an equal slice of every message of wire.StripeMin bytes or more.
type bareLink struct {
	conns []conn
	// Bidir only: per stripe, a second connection on which the peer sends,
	// so each direction has its own connection, as in Gyre.
	back []conn
	rbuf []byte
	// QUIC only: the one socket all stripes are dialed from.
	udp *net.UDPConn
	qt  *quic.Transport
}

// dialBareLink dials stripes connections, and as many again for the
// peer's direction if bidir.
func dialBareLink(ctx context.Context, kind BareKind, addr string, stripes int, bidir bool, id *secret.Identity) (*bareLink, error) {
	if addr == "" {
		return nil, fmt.Errorf("%w: the peer has no %s baseline", ErrProtocol, kind)
	}
	b := &bareLink{}
	if kind == BareQUIC {
		udp, err := udpSocket()
		if err != nil {
			return nil, fmt.Errorf("bench: bare quic socket: %w", err)
		}
		b.udp, b.qt = udp, &quic.Transport{Conn: udp}
	}
	n := stripes
	if bidir {
		n *= 2
	}
	for range n {
		cctx, cancel := context.WithTimeout(ctx, connectTimeout)
		c, err := dialBare(cctx, kind, addr, id, b.qt)
		cancel()
		if err != nil {
			b.close()
			return nil, err
		}
		b.conns = append(b.conns, c)
	}
	b.conns, b.back = b.conns[:stripes:stripes], b.conns[stripes:]
	return b, nil
}

// all returns every connection of b.
func (b *bareLink) all() []conn { return append(slices.Clip(b.conns), b.back...) }

func (b *bareLink) close() {
	for _, c := range b.all() {
		c.Close()
	}
	if b.qt != nil {
		b.qt.Close()
		b.udp.Close()
	}
}

// each runs f for every stripe i with its slice of msg, which starts at
// lo, concurrently when there are several, and joins the errors.
// Connection deadlines follow ctx.
func (b *bareLink) each(ctx context.Context, msg []byte, f func(i, lo int, part []byte) error) error {
	dl, _ := ctx.Deadline()
	for _, c := range b.all() {
		_ = c.SetDeadline(dl)
	}
	k := len(b.conns)
	if wire.StripesUsed(uint64(len(msg)), k) == 1 {
		return f(0, 0, msg)
	}
	errs := make([]error, k)
	var wg sync.WaitGroup
	for i := range k {
		lo, hi := wire.StripePart(uint64(len(msg)), k, i)
		part := msg[lo:hi]
		if len(part) == 0 {
			continue
		}
		wg.Go(func() { errs[i] = f(i, int(lo), part) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func sendCommand(c conn, cmd command) error {
	b := cmd.encode()
	if _, err := c.Write(b[:]); err != nil {
		return err
	}
	return readAnswer(c, opReady)
}

func readAnswer(c conn, op byte) error {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return err
	}
	if b[0] != op {
		return fmt.Errorf("%w: got answer %d, want %d", ErrProtocol, b[0], op)
	}
	return nil
}

func (b *bareLink) oneWay(ctx context.Context, msg []byte, count int) (time.Duration, error) {
	err := b.each(ctx, msg, func(i, _ int, part []byte) error {
		return sendCommand(b.conns[i], command{op: opOneWay, size: uint64(len(part)), count: uint32(count)})
	})
	if err != nil {
		return 0, err
	}
	t0 := time.Now()
	err = b.each(ctx, msg, func(i, _ int, part []byte) error {
		if err := writeRepeated(b.conns[i], part, count); err != nil {
			return err
		}
		return readAnswer(b.conns[i], opAck)
	})
	if err != nil {
		return 0, err
	}
	return time.Since(t0), nil
}

func (b *bareLink) pingPong(ctx context.Context, msg []byte, count int) ([]time.Duration, error) {
	c := b.conns[0]
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if err := sendCommand(c, command{op: opPingPong, size: uint64(len(msg)), count: uint32(count)}); err != nil {
		return nil, err
	}
	b.rbuf = grow(b.rbuf, len(msg))
	ds := make([]time.Duration, count)
	for i := range ds {
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, b.rbuf); err != nil {
			return nil, err
		}
		ds[i] = time.Since(t0)
	}
	return ds, nil
}

func (b *bareLink) release(ctx context.Context) error {
	dl, _ := ctx.Deadline()
	var errs []error
	for _, c := range b.all() {
		_ = c.SetDeadline(dl)
		errs = append(errs, sendCommand(c, command{op: opRelease}))
	}
	return errors.Join(errs...)
}

// mode names the throughput trial, for logs and errors.
func (o TransportOptions) mode() string {
	if o.Bidir {
		return "bidir"
	}
	return "one-way"
}

// throughput runs one timed throughput trial of count messages: one-way,
// or both ways at once with Bidir.
func (o TransportOptions) throughput(ctx context.Context, l link, msg []byte, count int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, trialTimeout(int64(len(msg))*int64(count)))
	defer cancel()
	if o.Bidir {
		return l.bidir(ctx, msg, count)
	}
	return l.oneWay(ctx, msg, count)
}
