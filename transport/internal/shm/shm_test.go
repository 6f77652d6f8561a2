//go:build linux

package shm

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gyre-ml/gyre/internal/secret"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/internal/streams"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// pair returns the two ends of one ring of size bytes over a socket pair,
// as a handshake leaves them, closed at the end of the test.
func pair(t *testing.T, size int) (*Writer, *Reader) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	wr, f, err := createRegion("test", size)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rr, err := openRegion(int(f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	w, r := &Writer{end: end{r: wr, conn: conns[0]}}, &Reader{end: end{r: rr, conn: conns[1]}}
	t.Cleanup(func() { w.Close(); r.Close() })
	return w, r
}

func TestRingCarriesMoreThanItHolds(t *testing.T) {
	w, r := pair(t, MinRing)
	msg := make([]byte, 5*MinRing+123) // wraps the ring several times
	rand.Read(msg)
	done := make(chan error, 1)
	go func() {
		for off := 0; off < len(msg); off += 1000 { // writes that straddle the ring's end
			if _, err := w.Write(msg[off:min(off+1000, len(msg))]); err != nil {
				done <- err
				return
			}
		}
		done <- w.Close()
	}()
	got, err := io.ReadAll(r) // EOF after the writer's close, once drained
	if err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatalf("read %d bytes, not the %d written", len(got), len(msg))
	}
}

func TestReadDeadlineLeavesTheStreamReadable(t *testing.T) {
	w, r := pair(t, MinRing)
	r.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
	var b [4]byte
	if _, err := r.Read(b[:]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read on an empty ring past its deadline: %v, want a timeout", err)
	}
	r.SetReadDeadline(time.Time{})
	w.Write([]byte("ping"))
	if n, err := r.Read(b[:]); err != nil || string(b[:n]) != "ping" {
		t.Fatalf("Read after the deadline was cleared: %q, %v", b[:n], err)
	}
}

func TestPollingReaderGetsTheMessage(t *testing.T) {
	w, r := pair(t, MinRing)
	r.SetPoll(time.Millisecond)
	go func() {
		time.Sleep(5 * time.Millisecond) // past the poll: the reader sleeps, then wakes
		w.Write([]byte("late"))
		w.Write([]byte("soon"))
	}()
	b := make([]byte, 8)
	if _, err := io.ReadFull(r, b); err != nil || string(b) != "latesoon" {
		t.Fatalf("read %q, %v", b, err)
	}
}

func TestCloseUnblocksBothEnds(t *testing.T) {
	_, r := pair(t, MinRing)  // nothing written: the Read waits
	w, r2 := pair(t, MinRing) // nothing read: the Write fills the ring, then waits
	errs := make(chan error, 2)
	go func() { _, err := r.Read(make([]byte, 1)); errs <- err }()
	go func() { _, err := w.Write(make([]byte, 2*MinRing)); errs <- err }()
	time.Sleep(20 * time.Millisecond)
	r.Close()  // ends the blocked Read
	r2.Close() // the Writer sees its reader gone
	for range 2 {
		select {
		case err := <-errs:
			if err == nil {
				t.Fatal("a call blocked on a closed stream returned no error")
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a call stayed blocked after Close")
		}
	}
}

func TestOpenRegionRefusesAnUnsealedMemfd(t *testing.T) {
	fd, err := unix.MemfdCreate("unsealed", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	unix.Ftruncate(fd, pageSize+MinRing)
	if _, err := openRegion(fd); err == nil {
		t.Fatal("mapped a ring its creator could still shrink under us")
	}
}

// locals starts two Locals, a and b, whose accepted streams go to the
// returned channels; caB is b's cluster CA (a's unless other).
func locals(t *testing.T, other bool) (a, b *Local, inB chan streams.InStream, refusedB chan error) {
	t.Helper()
	caA := transporttest.NewCA(t)
	caB := caA
	if other {
		caB = transporttest.NewCA(t)
	}
	inB, refusedB = make(chan streams.InStream, 256), make(chan error, 8)
	start := func(id string, ca *secret.CA, in chan streams.InStream, refused chan error) *Local {
		l, err := Listen(Config{ID: transport.PeerID(id), Identity: transporttest.Issue(t, ca, id), Kind: "test", Port: 1,
			Accept:  func(_ transport.PeerID, s streams.InStream) { in <- s },
			Refused: func(remote, _ string, err error) { refused <- errors.New(remote + ": " + err.Error()) },
			Logger:  transporttest.Logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		return l
	}
	a = start("a-"+rand.Text(), caA, make(chan streams.InStream, 8), make(chan error, 8))
	b = start("b-"+rand.Text(), caB, inB, refusedB)
	return a, b, inB, refusedB
}

func TestDialSendsThroughTheRing(t *testing.T) {
	a, b, inB, _ := locals(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	lk, err := a.Dial(ctx, b.cfg.ID, "127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	defer lk.Close()
	s, err := lk.OpenStream(ctx, transport.ChanData)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("hello"))
	in := <-inB
	defer in.Close()
	got := make([]byte, 5)
	if _, err := io.ReadFull(in, got); err != nil || string(got) != "hello" {
		t.Fatalf("read %q, %v", got, err)
	}
	if o, _ := a.Streams(); o != 1 {
		t.Fatalf("a opened %d streams, want 1", o)
	}
}

func TestDialElsewhereIsNotLocal(t *testing.T) {
	a, b, _, _ := locals(t, false)
	// Another port: the peer's network transport is not the one whose
	// socket is here.
	if _, err := a.Dial(context.Background(), b.cfg.ID, "127.0.0.1:2"); !errors.Is(err, ErrNotLocal) {
		t.Fatalf("Dial of a peer with no socket here: %v, want ErrNotLocal", err)
	}
}

func TestAnotherClusterCannotAttach(t *testing.T) {
	a, b, inB, refusedB := locals(t, true)
	_, err := a.Dial(context.Background(), b.cfg.ID, "127.0.0.1:1")
	if !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("Dial with another cluster's secret: %v, want ErrUnauthenticated", err)
	}
	select {
	case r := <-refusedB:
		if !bytes.Contains([]byte(r.Error()), []byte("pid ")) {
			t.Errorf("refusal %q does not name the process", r)
		}
	case <-time.After(5 * time.Second):
		t.Error("b did not record the refusal")
	}
	select {
	case <-inB:
		t.Fatal("b accepted a stream from another cluster")
	default:
	}
}

// A process without the key that connects and sends anything, or a ring
// descriptor at once, is never handed a stream nor sent anything but a
// refusal.
func TestGarbageOnTheSocketIsRefused(t *testing.T) {
	_, b, inB, _ := locals(t, false)
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n\r\n"), []byte(plainPreamble), {ringByte}} {
		c, err := net.Dial("unix", b.name)
		if err != nil {
			t.Fatal(err)
		}
		uc := c.(*net.UnixConn)
		if junk[0] == ringByte { // a ring before any handshake
			_, f, err := createRegion("junk", MinRing)
			if err != nil {
				t.Fatal(err)
			}
			uc.WriteMsgUnix(junk, syscall.UnixRights(int(f.Fd())), nil)
			f.Close()
		} else {
			c.Write(junk)
		}
		c.SetReadDeadline(time.Now().Add(time.Second)) // a ring byte is no TLS record: the server waits for more
		reply, _ := io.ReadAll(c)
		c.Close()
		if len(reply) > 1 || (len(reply) == 1 && reply[0] != nackByte) {
			t.Errorf("after %q the server sent %q", junk, reply)
		}
	}
	select {
	case <-inB:
		t.Fatal("a stream was accepted without authentication")
	case <-time.After(50 * time.Millisecond):
	}
}

// TestHandshakeCutIsNotAWrongSecret: a peer that closes its socket
// mid-handshake (it is shutting down, or restarting) fails the dial with
// an error a caller retries, never with ErrUnauthenticated, which a
// worker takes for a worker of another cluster.
func TestHandshakeCutIsNotAWrongSecret(t *testing.T) {
	a, _, _, _ := locals(t, false)
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: SocketName("test", 1, "ghost"), Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, err = a.Dial(context.Background(), "ghost", "127.0.0.1:1")
	if err == nil || errors.Is(err, transport.ErrUnauthenticated) || errors.Is(err, ErrNotLocal) {
		t.Fatalf("Dial of a peer that hangs up mid-handshake: %v, want a plain error", err)
	}
}

// TestBurstOfStreams: more streams than handshake slots, opened at once
// (the spares of many peers' links and stripes), all get through: a
// handshake waits for a slot rather than being refused.
func TestBurstOfStreams(t *testing.T) {
	a, b, inB, _ := locals(t, false)
	const n = 3 * maxHandshakes
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	errs := make(chan error, n)
	for range n {
		go func() {
			lk, err := a.Dial(ctx, b.cfg.ID, "127.0.0.1:1")
			if err == nil {
				var s streams.Stream
				if s, err = lk.OpenStream(ctx, transport.ChanControl); err == nil {
					s.Close()
				}
				lk.Close()
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("one of %d streams opened at once: %v", n, err)
		}
	}
	for range n {
		select {
		case s := <-inB:
			s.Close()
		case <-ctx.Done():
			t.Fatal("b did not accept every stream")
		}
	}
}

// TestDeadWriterIsNotAnOrderlyClose: a reader whose writer closed its end
// reads io.EOF once drained; one whose writer's socket went without a
// close (its process died) reads errPeerEnded, never io.EOF, which a
// transport would take for the peer's orderly close.
func TestDeadWriterIsNotAnOrderlyClose(t *testing.T) {
	w, r := pair(t, MinRing)
	w.Write([]byte("last"))
	w.Close()
	if got, err := io.ReadAll(r); err != nil || string(got) != "last" {
		t.Fatalf("after an orderly close: %q, %v; want the data, then io.EOF", got, err)
	}
	w2, r2 := pair(t, MinRing)
	w2.Write([]byte("last"))
	w2.conn.Close() // the socket goes as the process's would, without Close
	b := make([]byte, 8)
	if n, err := r2.Read(b); err != nil || string(b[:n]) != "last" {
		t.Fatalf("what the dead writer published: %q, %v", b[:n], err)
	}
	if _, err := r2.Read(b); !errors.Is(err, errPeerEnded) || errors.Is(err, io.EOF) {
		t.Fatalf("after the writer died: %v, want errPeerEnded", err)
	}
}

// TestDeadReaderIsNotAnOrderlyClose: a write to a reader that closed its
// end fails with ErrReaderClosed, the peer's orderly end; one to a reader
// whose process died (its socket gone without Close) fails otherwise.
func TestDeadReaderIsNotAnOrderlyClose(t *testing.T) {
	w, r := pair(t, MinRing)
	r.Close()
	if _, err := w.Write([]byte("x")); !errors.Is(err, ErrReaderClosed) {
		t.Fatalf("a write after the reader's Close: %v, want ErrReaderClosed", err)
	}
	w2, r2 := pair(t, MinRing)
	r2.conn.Close() // the socket goes as the process's would, without Close
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := w2.Write(make([]byte, MinRing/4))
		if err != nil {
			if errors.Is(err, ErrReaderClosed) {
				t.Fatalf("a write after the reader died: %v, want no orderly close", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("writes to a dead reader kept succeeding")
		}
	}
}
