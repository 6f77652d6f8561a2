package linkbench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/quic-go/quic-go"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// The peer protocol. The parent sends a command (op, size, count); the peer
// prepares a receive buffer of size bytes and answers ready, so allocation
// is never timed. Then:
//   - opOneWay: the parent sends count messages of size bytes; the peer
//     answers ack once it holds the last byte of the last one.
//   - opPingPong: count times, the parent sends size bytes and the peer
//     echoes them.
//   - opBidir (Gyre transports only): the parent and the peer each send
//     count messages of size bytes to the other at once, after the parent
//     sends go (bidir.go).
//   - opSendBack (bare connections only): the peer sends count messages
//     of size bytes once the parent sends go. A bare bidir trial runs it on
//     one connection while opOneWay runs on another, so each direction has
//     its own connection (bidir.go).
//   - opRelease: the peer frees its buffers.
//
// Over a Gyre transport a command is an empty message on ChanControl whose
// header carries op in Step, size in Total and count in Chunk; payloads go
// on ChanData and the answers on ChanControl. Over a bare connection a
// command is cmdSize bytes and each answer one byte; payloads are raw bytes.
const (
	opOneWay   = 1
	opPingPong = 2
	opRelease  = 3
	opReady    = 4
	opAck      = 5
	opBidir    = 6
	opGo       = 7
	opSendBack = 8
)

// cmdSize is the encoded size of a bare command: op uint32, count uint32,
// size uint64, little-endian.
const cmdSize = 16

// MaxMessage bounds the message size a peer agrees to allocate. Larger
// than the biggest size in the conventions (256M), well below memory.
const MaxMessage = 1 << 30

// Peer IDs of the two sides; certificates carry them as common names.
const (
	parentID transport.PeerID = "bench-parent"
	peerID   transport.PeerID = "bench-peer"
)

// ErrProtocol means the other side broke the benchmark protocol.
var ErrProtocol = errors.New("bench: protocol error")

type command struct {
	op    uint32
	count uint32
	size  uint64
}

func (c command) check() error {
	switch {
	case c.op != opOneWay && c.op != opPingPong && c.op != opBidir && c.op != opSendBack && c.op != opRelease:
		return fmt.Errorf("%w: unknown op %d", ErrProtocol, c.op)
	case c.size > MaxMessage:
		return fmt.Errorf("%w: message of %d bytes exceeds %d", ErrProtocol, c.size, MaxMessage)
	}
	return nil
}

func (c command) encode() [cmdSize]byte {
	var b [cmdSize]byte
	binary.LittleEndian.PutUint32(b[0:], c.op)
	binary.LittleEndian.PutUint32(b[4:], c.count)
	binary.LittleEndian.PutUint64(b[8:], c.size)
	return b
}

func decodeCommand(b [cmdSize]byte) command {
	return command{
		op:    binary.LittleEndian.Uint32(b[0:]),
		count: binary.LittleEndian.Uint32(b[4:]),
		size:  binary.LittleEndian.Uint64(b[8:]),
	}
}

func (c command) header() wire.Header {
	return wire.Header{Kind: wire.KindControl, Step: c.op, Total: c.size, Chunk: c.count}
}

func commandOf(h wire.Header) command {
	return command{op: h.Step, size: h.Total, count: h.Chunk}
}

// dataHeader labels benchmark payloads.
var dataHeader = wire.Header{Kind: wire.KindBench}

// grow returns buf if it holds n bytes, else a new buffer of n bytes.
func grow(buf []byte, n int) []byte {
	if cap(buf) >= n {
		return buf[:n]
	}
	return make([]byte, n)
}

// conn is a bare byte stream: a TCP or TLS connection, or a QUIC stream
// together with its connection.
type conn interface {
	io.ReadWriteCloser
	SetDeadline(time.Time) error
}

// serveBare answers the parent's commands on one bare connection until it
// closes. Cancelling ctx closes c.
func serveBare(ctx context.Context, c conn) error {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer c.Close()
	var buf, send []byte
	var cb [cmdSize]byte
	answer := func(b byte) error {
		_, err := c.Write([]byte{b})
		return err
	}
	for {
		if _, err := io.ReadFull(c, cb[:]); err != nil {
			if closedCleanly(err) || ctx.Err() != nil {
				return nil
			}
			return err
		}
		cmd := decodeCommand(cb)
		if err := cmd.check(); err != nil {
			return err
		}
		switch cmd.op {
		case opRelease:
			buf, send = nil, nil
			if err := answer(opReady); err != nil {
				return err
			}
			continue
		case opSendBack:
			send = fillMessage(grow(send, int(cmd.size)))
			if err := answer(opReady); err != nil {
				return err
			}
			if err := serveBareSendBack(c, send, int(cmd.count)); err != nil {
				return err
			}
			continue
		case opBidir:
			return fmt.Errorf("%w: bidir over one bare connection", ErrProtocol)
		}
		buf = grow(buf, int(cmd.size))
		if err := answer(opReady); err != nil {
			return err
		}
		for range cmd.count {
			if err := readChunked(c, buf); err != nil {
				return err
			}
			if cmd.op == opPingPong {
				if err := writeChunked(c, buf); err != nil {
					return err
				}
			}
		}
		if cmd.op == opOneWay {
			if err := answer(opAck); err != nil {
				return err
			}
		}
	}
}

// bareChunk is the largest read or write a baseline asks of the kernel at
// once: the frame size of the Gyre transports, so that a baseline differs
// from Gyre by the frame headers and not by its system-call sizes.
const bareChunk = wire.DefaultMaxFrame

func writeChunked(c conn, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), bareChunk)
		if _, err := c.Write(p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// writeRepeated writes p to c count times.
func writeRepeated(c conn, p []byte, count int) error {
	for range count {
		if err := writeChunked(c, p); err != nil {
			return err
		}
	}
	return nil
}

// readRepeated reads exactly len(p) bytes from c into p count times.
func readRepeated(c conn, p []byte, count int) error {
	for range count {
		if err := readChunked(c, p); err != nil {
			return err
		}
	}
	return nil
}

func readChunked(c conn, p []byte) error {
	for len(p) > 0 {
		n := min(len(p), bareChunk)
		if _, err := io.ReadFull(c, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// closedCleanly reports whether a read between commands failed because the
// parent closed the connection in the ordinary way.
func closedCleanly(err error) bool {
	var app *quic.ApplicationError
	if errors.As(err, &app) {
		return app.Remote && app.ErrorCode == 0
	}
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}

// serveLink answers the parent's commands on one Gyre transport until it
// is closed or ctx is done.
func serveLink(ctx context.Context, t transport.Transport) error {
	var buf, send []byte
	var cb [64]byte
	answer := func(op uint32) error {
		return t.Send(ctx, parentID, transport.ChanControl, command{op: op}.header(), nil)
	}
	for {
		h, _, err := t.Recv(ctx, parentID, transport.ChanControl, cb[:])
		if err != nil {
			if errors.Is(err, transport.ErrClosed) || ctx.Err() != nil {
				return nil //nolint:nilerr // the parent ended the run: the peer's job is done
			}
			return err
		}
		cmd := commandOf(h)
		if err := cmd.check(); err != nil {
			return err
		}
		switch cmd.op {
		case opRelease:
			buf, send = nil, nil
			if err := answer(opReady); err != nil {
				return err
			}
			continue
		case opBidir:
			buf = grow(buf, int(cmd.size))
			send = fillMessage(grow(send, int(cmd.size)))
			if err := answer(opReady); err != nil {
				return err
			}
			if err := serveLinkBidir(ctx, t, buf, send, int(cmd.count)); err != nil {
				return err
			}
			continue
		case opSendBack:
			return fmt.Errorf("%w: send-back over a Gyre transport", ErrProtocol)
		}
		buf = grow(buf, int(cmd.size))
		if err := answer(opReady); err != nil {
			return err
		}
		for range cmd.count {
			_, n, err := t.Recv(ctx, parentID, transport.ChanData, buf)
			if err != nil {
				return err
			}
			if n != len(buf) {
				return fmt.Errorf("%w: got a message of %d bytes, want %d", ErrProtocol, n, len(buf))
			}
			if cmd.op == opPingPong {
				if err := t.Send(ctx, parentID, transport.ChanData, dataHeader, buf); err != nil {
					return err
				}
			}
		}
		if cmd.op == opOneWay {
			if err := answer(opAck); err != nil {
				return err
			}
		}
	}
}
