package linkbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gyre-ml/gyre/transport"
)

// The bidirectional trial (TransportOptions.Bidir): both processes send
// count messages of the same size to each other at once, which is the
// traffic of a two-rank ring. After the command and its ready answer (the
// peer has its buffers), the parent starts the clock and sends go; the
// peer starts sending when go arrives. The peer acks once it holds the
// last byte of the parent's last message (over a Gyre transport, once it
// has also sent all of its own), and the parent stops the clock once it
// holds the peer's last byte and that ack. Both sides send the bytes
// fillMessage writes, so the parent can check what it received, after the
// clock has stopped.
//
// A Gyre transport sends each direction on connections its own side
// dialed, one per stripe, so a pair of processes uses one connection per
// direction and stripe (for quic, quic-go runs one loop per connection).
// The bare baseline has the same layout: per stripe, the parent's slice
// goes out on one connection as a one-way trial (opOneWay, acked) while
// the peer sends its slice back on another (opSendBack, started by go).
// The parent dials both, from one socket for QUIC as Gyre does.

// fillMessage writes the benchmark's payload pattern into b. It varies
// byte by byte and from one 2 KiB block to the next, so a misplaced frame
// shows.
func fillMessage(b []byte) []byte {
	for i := range b {
		b[i] = byte(i*7 + i>>11)
	}
	return b
}

// duplex runs send and recv concurrently and returns once both are done.
// The first to fail calls abort, once, which must unblock the other.
func duplex(abort func(), send, recv func() error) error {
	abort = sync.OnceFunc(abort)
	errs := make(chan error, 2)
	for _, f := range []func() error{send, recv} {
		go func() {
			err := f()
			if err != nil {
				abort()
			}
			errs <- err
		}()
	}
	return errors.Join(<-errs, <-errs)
}

// bidir is the parent's side of the trial over a Gyre transport.
func (g *gyreLink) bidir(ctx context.Context, msg []byte, count int) (time.Duration, error) {
	if err := g.command(ctx, command{op: opBidir, size: uint64(len(msg)), count: uint32(count)}); err != nil {
		return 0, err
	}
	g.rbuf = grow(g.rbuf, len(msg))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	if err := g.t.Send(ctx, peerID, transport.ChanControl, command{op: opGo}.header(), nil); err != nil {
		return 0, err
	}
	err := duplex(cancel,
		func() error { return sendMessages(ctx, g.t, peerID, msg, count) },
		func() error {
			if err := recvMessages(ctx, g.t, peerID, g.rbuf, count); err != nil {
				return err
			}
			return g.expect(ctx, opAck)
		})
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if !bytes.Equal(g.rbuf, msg) {
		return 0, fmt.Errorf("%w: the peer's message arrived corrupted", ErrProtocol)
	}
	return d, nil
}

// bidir is the parent's side of the trial over the bare connections. Each
// direction has its own connection per stripe, as in Gyre: on b.conns the
// parent sends its stripe's slice (a one-way trial, acked), while on b.back
// the peer sends its slice back.
func (b *bareLink) bidir(ctx context.Context, msg []byte, count int) (time.Duration, error) {
	err := b.each(ctx, msg, func(i, _ int, part []byte) error {
		cmd := command{op: opOneWay, size: uint64(len(part)), count: uint32(count)}
		if err := sendCommand(b.conns[i], cmd); err != nil {
			return err
		}
		cmd.op = opSendBack
		return sendCommand(b.back[i], cmd)
	})
	if err != nil {
		return 0, err
	}
	b.rbuf = grow(b.rbuf, len(msg))
	t0 := time.Now()
	err = b.each(ctx, msg, func(i, lo int, part []byte) error {
		out, back := b.conns[i], b.back[i]
		if _, err := back.Write([]byte{opGo}); err != nil {
			return err
		}
		// A past deadline unblocks whichever direction is still going.
		abort := func() {
			_ = out.SetDeadline(time.Now())
			_ = back.SetDeadline(time.Now())
		}
		return duplex(abort,
			func() error {
				if err := writeRepeated(out, part, count); err != nil {
					return err
				}
				return readAnswer(out, opAck)
			},
			func() error { return readRepeated(back, b.rbuf[lo:lo+len(part)], count) })
	})
	d := time.Since(t0)
	if err != nil {
		return 0, err
	}
	// Each connection of the peer knows only its slice's length, so it
	// sends the pattern's first bytes.
	err = b.each(ctx, msg, func(_, lo int, part []byte) error {
		if !bytes.Equal(b.rbuf[lo:lo+len(part)], msg[:len(part)]) {
			return fmt.Errorf("%w: the peer's slice at %d arrived corrupted", ErrProtocol, lo)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return d, nil
}

// serveLinkBidir is the peer's side of the trial over a Gyre transport,
// once it has answered ready.
func serveLinkBidir(ctx context.Context, t transport.Transport, recv, send []byte, count int) error {
	var cb [64]byte
	h, _, err := t.Recv(ctx, parentID, transport.ChanControl, cb[:])
	if err != nil {
		return err
	}
	if h.Step != opGo {
		return fmt.Errorf("%w: got op %d, want go", ErrProtocol, h.Step)
	}
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	err = duplex(cancel,
		func() error { return sendMessages(dctx, t, parentID, send, count) },
		func() error { return recvMessages(dctx, t, parentID, recv, count) })
	if err != nil {
		return err
	}
	return t.Send(ctx, parentID, transport.ChanControl, command{op: opAck}.header(), nil)
}

// serveBareSendBack is the peer's side of a send-back on one bare
// connection, once it has answered ready: its direction of a bare bidir
// trial.
func serveBareSendBack(c conn, send []byte, count int) error {
	if err := readAnswer(c, opGo); err != nil {
		return err
	}
	return writeRepeated(c, send, count)
}

// sendMessages sends msg to peer count times on the data channel.
func sendMessages(ctx context.Context, t transport.Transport, peer transport.PeerID, msg []byte, count int) error {
	for range count {
		if err := t.Send(ctx, peer, transport.ChanData, dataHeader, msg); err != nil {
			return err
		}
	}
	return nil
}

// recvMessages receives count messages of exactly len(buf) bytes from peer
// on the data channel into buf.
func recvMessages(ctx context.Context, t transport.Transport, peer transport.PeerID, buf []byte, count int) error {
	for range count {
		_, n, err := t.Recv(ctx, peer, transport.ChanData, buf)
		if err != nil {
			return err
		}
		if n != len(buf) {
			return fmt.Errorf("%w: got a message of %d bytes, want %d", ErrProtocol, n, len(buf))
		}
	}
	return nil
}
