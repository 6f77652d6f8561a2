package tcp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// unusable is a connection whose reads fail: a pollConn that reads
// through it did not poll.
type unusable struct{ net.Conn }

var errNotPolled = errors.New("read without polling")

func (unusable) Read([]byte) (int, error) { return 0, errNotPolled }

// TestPollConnReadsTheSocket: with a poll set, a read that finds nothing
// polls the socket itself, then sleeps until the bytes come; a read
// deadline ends a poll however long it had left, and EOF is reported.
// Without a poll it reads through the wrapped connection.
func TestPollConnReadsTheSocket(t *testing.T) {
	client, server := barePair(t, true)
	p := newPollConn(unusable{server}, server)
	if p.rc == nil {
		t.Fatal("a TCP socket gave no file descriptor to poll")
	}
	buf := make([]byte, 16)
	if _, err := p.Read(buf); !errors.Is(err, errNotPolled) {
		t.Fatalf("read with no poll: %v, want it through the wrapped connection", err)
	}

	p.setPoll(100 * time.Microsecond)
	// Sent after the poll has run out: the read sleeps, then wakes.
	time.AfterFunc(20*time.Millisecond, func() { client.Write([]byte("late")) })
	n, err := p.Read(buf)
	if err != nil || string(buf[:n]) != "late" {
		t.Fatalf("polled read: %q, %v; want \"late\"", buf[:n], err)
	}
	if _, err := client.Write([]byte("early")); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for len(got) < len("early") {
		n, err := p.Read(buf)
		if err != nil {
			t.Fatalf("polled read: %v", err)
		}
		got = append(got, buf[:n]...)
	}
	if string(got) != "early" {
		t.Fatalf("polled read: %q, want \"early\"", got)
	}

	// A Recv cancelled while it polls: the deadline, not the hour, ends it.
	p.setPoll(time.Hour)
	p.SetReadDeadline(time.Now().Add(30 * time.Millisecond))
	done := make(chan error, 1)
	go func() {
		_, err := p.Read(buf)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("polled read past its deadline: %v, want a timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a polled read ignored its deadline")
	}
	p.SetReadDeadline(time.Time{})
	client.Close()
	if _, err := p.Read(buf); err != io.EOF {
		t.Fatalf("polled read of a closed connection: %v, want EOF", err)
	}
}

// TestPolledRecv: Recvs under transport.WithPoll, over TLS and plain TCP,
// get every message intact whether it was sent before or long after the
// Recv began, and one cancelled while nothing has come leaves the stream
// in step.
func TestPolledRecv(t *testing.T) {
	for _, insecure := range []bool{false, true} {
		t.Run(map[bool]string{false: "tls", true: "insecure"}[insecure], func(t *testing.T) {
			ctx := testContext(t, 30*time.Second)
			nodes := newNodes(insecure, nil)(t, 2)
			a, b := nodes[0].T, nodes[1].T
			transporttest.ConnectAll(t, ctx, nodes)
			polled := transport.WithPoll(ctx, 200*time.Microsecond)
			send := func(i int, size int) {
				msg := bytes.Repeat([]byte{byte(i)}, size)
				if err := b.Send(ctx, nodes[0].ID, transport.ChanData, wire.Header{Kind: wire.KindData, Seq: uint64(i)}, msg); err != nil {
					t.Error(err)
				}
			}
			recv := func(i int, size int) {
				buf := make([]byte, size)
				h, n, err := a.Recv(polled, nodes[1].ID, transport.ChanData, buf)
				if err != nil || h.Seq != uint64(i) || n != size || !bytes.Equal(buf, bytes.Repeat([]byte{byte(i)}, size)) {
					t.Fatalf("message %d: seq %d, %d bytes, %v", i, h.Seq, n, err)
				}
			}
			for i := range 200 { // back to back, as a small collective's
				go send(i, 4096)
				recv(i, 4096)
			}
			time.AfterFunc(20*time.Millisecond, func() { send(200, 100) })
			recv(200, 100)

			cctx, cancel := context.WithTimeout(polled, 30*time.Millisecond)
			defer cancel()
			if _, _, err := a.Recv(cctx, nodes[1].ID, transport.ChanData, make([]byte, 100)); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("polled Recv cancelled with nothing sent: %v, want DeadlineExceeded", err)
			}
			go send(201, 1<<20)
			recv(201, 1<<20)
		})
	}
}
