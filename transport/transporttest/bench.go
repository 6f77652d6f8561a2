package transporttest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// benchTimeout bounds every blocking call of a benchmark, so a broken
// transport fails the benchmark instead of hanging it.
const benchTimeout = 5 * time.Minute

// windowBytes is how far the sender of BenchmarkOneWay may run ahead of the
// receiver, about a socket buffer's worth. Without a window an in-memory
// transport, whose Send never blocks, would queue the whole run in memory.
const windowBytes = 4 << 20

// BenchmarkOneWay measures one-way throughput from nodes[0] to nodes[1] on
// ChanData with messages of size bytes (b.SetBytes(size), so the result is
// in MB/s), and reports allocations. The receiver returns credit on
// ChanControl every half window, which keeps at most windowBytes (at least
// two messages) in flight. The nodes need not be connected beforehand.
func BenchmarkOneWay(b *testing.B, nodes []Node, size int) {
	b.Helper()
	src, dst := benchPair(b, nodes)
	ctx, cancel := context.WithTimeout(b.Context(), benchTimeout)
	defer cancel()
	connectPair(b, ctx, src, dst)

	window := max(2, windowBytes/max(size, 1))
	ackEvery := window / 2
	payload := make([]byte, size)
	FillPattern(payload, 1)
	buf := make([]byte, size)
	data := wire.Header{Kind: wire.KindBench, DType: wire.DTypeBytes}
	credit := wire.Header{Kind: wire.KindControl, DType: wire.DTypeBytes}

	warmUp(b, ctx, src, dst, payload, buf)
	b.SetBytes(int64(size))
	b.ReportAllocs()
	// A plain b.N loop rather than b.Loop: the timed region must end only
	// once the receiver has taken the last message, and the receiver must
	// know how many messages to expect.
	n := b.N
	acks := (n + ackEvery - 1) / ackEvery
	b.ResetTimer()
	recvd := async(func() error {
		for i := range n {
			h, got, err := dst.T.Recv(ctx, src.ID, transport.ChanData, buf)
			if err != nil {
				return fmt.Errorf("recv message %d: %w", i, err)
			}
			if got != size || h.Kind != wire.KindBench {
				return fmt.Errorf("recv message %d: %d bytes of kind %d, want %d of kind %d", i, got, h.Kind, size, wire.KindBench)
			}
			if (i+1)%ackEvery == 0 || i == n-1 {
				if err := dst.T.Send(ctx, src.ID, transport.ChanControl, credit, nil); err != nil {
					return fmt.Errorf("send credit: %w", err)
				}
			}
		}
		return nil
	})
	acked := 0
	takeCredit := func() {
		if _, _, err := src.T.Recv(ctx, dst.ID, transport.ChanControl, nil); err != nil {
			b.Fatalf("recv credit: %v", err)
		}
		acked++
	}
	for i := range n {
		for i-acked*ackEvery >= window {
			takeCredit()
		}
		if err := src.T.Send(ctx, dst.ID, transport.ChanData, data, payload); err != nil {
			b.Fatalf("send message %d: %v", i, err)
		}
	}
	for acked < acks {
		takeCredit()
	}
	b.StopTimer()
	if err := await(b, ctx, "receiver", recvd); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkRoundTrip measures the round trip (ping-pong) latency of a
// message of size bytes between nodes[0] and nodes[1]: one op is a message
// there and its echo back, so ns/op is the round-trip time. It reports
// allocations. The nodes need not be connected beforehand.
func BenchmarkRoundTrip(b *testing.B, nodes []Node, size int) {
	b.Helper()
	src, dst := benchPair(b, nodes)
	ctx, cancel := context.WithTimeout(b.Context(), benchTimeout)
	defer cancel()
	connectPair(b, ctx, src, dst)

	payload := make([]byte, size)
	FillPattern(payload, 1)
	buf := make([]byte, size)
	echoBuf := make([]byte, size)
	hdr := wire.Header{Kind: wire.KindBench, DType: wire.DTypeBytes}

	warmUp(b, ctx, src, dst, payload, buf)
	warmUp(b, ctx, dst, src, payload, echoBuf)
	b.ReportAllocs()
	n := b.N // as in BenchmarkOneWay, the echo side must know the count
	b.ResetTimer()
	echoed := async(func() error {
		for i := range n {
			h, got, err := dst.T.Recv(ctx, src.ID, transport.ChanData, echoBuf)
			if err != nil {
				return fmt.Errorf("echo recv %d: %w", i, err)
			}
			if err := dst.T.Send(ctx, src.ID, transport.ChanData, h, echoBuf[:got]); err != nil {
				return fmt.Errorf("echo send %d: %w", i, err)
			}
		}
		return nil
	})
	for i := range n {
		if err := src.T.Send(ctx, dst.ID, transport.ChanData, hdr, payload); err != nil {
			b.Fatalf("send %d: %v", i, err)
		}
		if _, got, err := src.T.Recv(ctx, dst.ID, transport.ChanData, buf); err != nil || got != size {
			b.Fatalf("recv echo %d: %d bytes, %v", i, got, err)
		}
	}
	b.StopTimer()
	if err := await(b, ctx, "echo", echoed); err != nil {
		b.Fatal(err)
	}
}

// warmUps is how many messages warmUp sends, as nccl-tests' default warm-up
// iterations.
const warmUps = 3

// warmUp sends a few messages from src to dst before timing starts, so that
// connections, streams and buffer pools are set up and the first timed
// iterations do not pay for them.
func warmUp(b *testing.B, ctx context.Context, src, dst Node, payload, buf []byte) {
	b.Helper()
	hdr := wire.Header{Kind: wire.KindBench, DType: wire.DTypeBytes}
	recvd := async(func() error {
		for range warmUps {
			if _, _, err := dst.T.Recv(ctx, src.ID, transport.ChanData, buf); err != nil {
				return fmt.Errorf("warm-up recv: %w", err)
			}
		}
		return nil
	})
	for range warmUps {
		if err := src.T.Send(ctx, dst.ID, transport.ChanData, hdr, payload); err != nil {
			b.Fatalf("warm-up send: %v", err)
		}
	}
	if err := await(b, ctx, "warm-up receiver", recvd); err != nil {
		b.Fatal(err)
	}
}

func benchPair(b *testing.B, nodes []Node) (src, dst Node) {
	b.Helper()
	if len(nodes) < 2 {
		b.Fatalf("need 2 nodes, got %d", len(nodes))
	}
	return nodes[0], nodes[1]
}

// connectPair connects a and b to each other (Connect is idempotent, so
// nodes already connected by ConnectAll are fine).
func connectPair(tb testing.TB, ctx context.Context, a, b Node) {
	tb.Helper()
	ConnectAll(tb, ctx, []Node{a, b})
}
