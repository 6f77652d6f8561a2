package transporttest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// Node is one transport under test with the address peers pass to Connect.
type Node struct {
	ID   transport.PeerID
	T    transport.Transport
	Addr string
}

// NewNodes makes n fresh, unconnected transports that can reach each other.
// The suite closes them (Close must be idempotent, so the factory may also
// register t.Cleanup closes).
type NewNodes func(tb testing.TB, n int) []Node

// ConnectAll connects every node to every other node. The nodes dial
// concurrently, so each pair is connected from both ends at about the same
// time, as when a ring forms; a transport that cannot cope with crossed dials
// fails here.
func ConnectAll(tb testing.TB, ctx context.Context, nodes []Node) {
	tb.Helper()
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Go(func() {
			for j, peer := range nodes {
				if j == i {
					continue
				}
				if err := nodes[i].T.Connect(ctx, peer.ID, peer.Addr); err != nil {
					errs[i] = errors.Join(errs[i], fmt.Errorf("%s connect to %s at %s: %w", nodes[i].ID, peer.ID, peer.Addr, err))
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		tb.Fatal(err)
	}
}

// FillPattern fills b with a pseudo-random pattern determined by seed, so a
// receiver can check every byte without a copy of what was sent. Unlike
// zeros, a pattern catches shifted, repeated or misplaced bytes.
func FillPattern(b []byte, seed uint64) {
	patternSource(seed).Read(b)
}

// CheckPattern reports whether b holds exactly the pattern that FillPattern
// writes for seed, naming the first differing offset if not. It regenerates
// the pattern in small pieces, so checking a large message needs no second
// buffer of its size.
func CheckPattern(b []byte, seed uint64) error {
	src := patternSource(seed)
	var want [32 << 10]byte
	for off := 0; off < len(b); off += len(want) {
		got := b[off:min(off+len(want), len(b))]
		w := want[:len(got)]
		src.Read(w)
		if !bytes.Equal(got, w) {
			for i := range got {
				if got[i] != w[i] {
					return fmt.Errorf("payload differs at byte %d of %d: got %#02x, want %#02x", off+i, len(b), got[i], w[i])
				}
			}
		}
	}
	return nil
}

func patternSource(seed uint64) *rand.ChaCha8 {
	var key [32]byte
	binary.LittleEndian.PutUint64(key[:], seed)
	binary.LittleEndian.PutUint64(key[8:], 0x67797265) // "gyre": keeps seed 0 away from the all-zero key
	return rand.NewChaCha8(key)
}

// testHeader returns a header for message i whose every field is set and
// differs from message to message, so a transport that drops, truncates or
// mixes up any field is caught. Len is deliberately wrong: Send must set it.
func testHeader(i int) wire.Header {
	u := uint64(i)
	return wire.Header{
		Kind:      wire.KindData + wire.Kind(i%4),
		Flags:     uint8(0x80 | i),
		DType:     wire.DTypeFloat32 + wire.DType(i%6),
		Op:        wire.OpSum + wire.Op(i%4),
		Algo:      uint8(7 + i),
		Epoch:     1<<40 + u,
		Seq:       1<<33 + 3*u,
		Step:      1<<31 + uint32(i),
		Chunk:     1<<30 + 5*uint32(i),
		Total:     1<<50 + 7*u,
		ChunkSize: 1<<20 + 11*uint32(i),
		Len:       0xdeadbeef,
	}
}

// checkHeader compares every field of got with want, whose Len is replaced by
// the payload length n.
func checkHeader(got, want wire.Header, n int) error {
	want.Len = uint64(n)
	if got != want {
		return fmt.Errorf("header\n got %+v\nwant %+v", got, want)
	}
	return nil
}

// async runs f in a goroutine and returns a channel that yields its result.
// Goroutines in the suite report through such channels and never call
// testing methods, so they may outlive a failed test without a panic; the
// case's context deadline and the closing of the nodes end them.
func async(f func() error) <-chan error {
	c := make(chan error, 1)
	go func() { c <- f() }()
	return c
}

// recvResult is what a Recv returned, carried out of a goroutine.
type recvResult struct {
	hdr wire.Header
	n   int
	err error
}

func asyncRecv(ctx context.Context, node Node, from transport.PeerID, ch transport.Channel, buf []byte) <-chan recvResult {
	c := make(chan recvResult, 1)
	go func() {
		h, n, err := node.T.Recv(ctx, from, ch, buf)
		c <- recvResult{h, n, err}
	}()
	return c
}
