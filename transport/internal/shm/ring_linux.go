package shm

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A ring is one direction of one stream: a memfd holding a control page
// and a power-of-two byte ring that one writer fills and one reader
// drains. The memfd is created by the writer, sealed against shrinking
// and growing so the reader can never fault on a truncated mapping, and
// handed to the reader over the stream's Unix socket (SCM_RIGHTS). It has
// no name: when both processes have closed or lost it, the kernel frees
// it, so nothing is left behind after kill -9.
//
// The socket stays open beside the memory. It carries one-byte wake-ups
// (a side about to sleep says so in the control page, and the other side
// writes a byte only then), so a waiting side blocks in the kernel through
// Go's netpoller, honouring read deadlines. Its end-of-file tells either
// side that the other has closed the stream or died.

// Control page layout: the writer's and the reader's words sit on cache
// lines of their own, so neither side's stores invalidate the other's.
const (
	offMagic         = 0   // uint64, magic
	offSize          = 8   // uint64, ring bytes
	offHead          = 64  // uint64, bytes ever written (the writer's)
	offReaderWaiting = 72  // uint32, the reader sleeps until a wake-up
	offTail          = 128 // uint64, bytes ever read (the reader's)
	offWriterWaiting = 136 // uint32, the writer sleeps until a wake-up
	offWriterClosed  = 192 // uint32, 1 once the writer closed its end on purpose
	offReaderClosed  = 196 // uint32, 1 once the reader closed its end
	pageSize         = 4096
	magic            = 0x31_4d_48_53_45_52_59_47 // "GYRESHM1"
)

// Ring sizes are powers of two in [MinRing, MaxRing].
const (
	MinRing = 16 << 10
	MaxRing = 64 << 20
)

var (
	errCorrupt = errors.New("shared memory: the peer's ring counters are inconsistent")
	errClosed  = net.ErrClosed
	// errPeerEnded is the end of a stream whose writer did not close it:
	// its process ended (kill -9, a crash). It is not io.EOF, which a
	// transport takes for the peer's orderly close, as a QUIC FIN.
	errPeerEnded = errors.New("shared memory: the peer's process ended without closing the stream")
)

// region is one mapped ring.
type region struct {
	mem  []byte // the whole mapping
	ring []byte // mem[pageSize:]
	mask uint64
}

func (r *region) u64(off int) *uint64 { return (*uint64)(unsafe.Pointer(&r.mem[off])) }
func (r *region) u32(off int) *uint32 { return (*uint32)(unsafe.Pointer(&r.mem[off])) }

// createRegion makes a sealed memfd for a ring of size bytes and maps it.
func createRegion(name string, size int) (*region, *os.File, error) {
	if size < MinRing || size > MaxRing || bits.OnesCount(uint(size)) != 1 {
		return nil, nil, fmt.Errorf("shared memory: ring size %d is not a power of two in [%d, %d]", size, MinRing, MaxRing)
	}
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("shared memory: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	total := pageSize + size
	if err := unix.Ftruncate(fd, int64(total)); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("shared memory: sizing the ring: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("shared memory: sealing the ring: %w", err)
	}
	r, err := mapRegion(fd, total)
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	*r.u64(offSize) = uint64(size)
	atomic.StoreUint64(r.u64(offMagic), magic)
	return r, f, nil
}

// openRegion maps a ring a peer created, after checking that the memfd
// is sealed against shrinking (so no access can fault) and that its
// control page describes a ring of exactly the file's size.
func openRegion(fd int) (*region, error) {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return nil, fmt.Errorf("shared memory: the peer's descriptor is not a memfd: %w", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 || seals&unix.F_SEAL_GROW == 0 {
		return nil, errors.New("shared memory: the peer's memfd is not sealed against resizing")
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("shared memory: %w", err)
	}
	size := st.Size - pageSize
	if size < MinRing || size > MaxRing || bits.OnesCount64(uint64(size)) != 1 {
		return nil, fmt.Errorf("shared memory: the peer's memfd holds %d bytes, not a ring", st.Size)
	}
	r, err := mapRegion(fd, int(st.Size))
	if err != nil {
		return nil, err
	}
	if atomic.LoadUint64(r.u64(offMagic)) != magic || atomic.LoadUint64(r.u64(offSize)) != uint64(size) {
		r.unmap()
		return nil, errors.New("shared memory: the peer's ring has a bad header")
	}
	return r, nil
}

// mapRegion maps a ring with its pages populated: a ring fills page by
// page, and a first touch of each page, in both processes, cost a page
// fault per small message (about 8 us of a 10 us 4 KiB allreduce) until
// the ring had wrapped once.
func mapRegion(fd, total int) (*region, error) {
	mem, err := unix.Mmap(fd, 0, total, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("shared memory: mmap: %w", err)
	}
	return &region{mem: mem, ring: mem[pageSize:], mask: uint64(total-pageSize) - 1}, nil
}

// unmap releases the mapping; it fails only for a bad address, which
// region never holds.
func (r *region) unmap() { _ = unix.Munmap(r.mem) }

// end is what a ring's writer and reader share: the mapping, the socket
// and the rules for closing them while another goroutine is in a call.
type end struct {
	r    *region
	conn *net.UnixConn
	raw  syscall.RawConn // conn's, for the wake-ups and peeks that must not block

	// mu is held shared by every call that touches the mapping and
	// exclusively by Close before it unmaps it, so that no call reads or
	// writes memory that is gone. Close first closes the socket, which
	// ends any call blocked on it.
	mu     sync.RWMutex
	closed atomic.Bool
	once   sync.Once
	tok    [64]byte // wake-ups read at once; the call holding mu uses it
	poll   atomic.Int64
}

func (e *end) Close() error {
	e.once.Do(func() {
		e.closed.Store(true)
		e.conn.Close()
		e.mu.Lock()
		e.r.unmap()
		e.mu.Unlock()
	})
	return nil
}

var wakeByte = []byte{1}

// rawConn returns conn's raw connection, made once: SyscallConn
// allocates, and wake-ups are on the collectives' path. Only the call
// holding mu (one at a time per end) uses it.
func (e *end) rawConn() syscall.RawConn {
	if e.raw == nil {
		e.raw, _ = e.conn.SyscallConn() // fails only for a nil conn
	}
	return e.raw
}

// wake tells the other side, which said it would sleep, to look again.
// The flag is cleared first, so one wait costs at most one byte. The
// write never blocks: a byte already queued wakes the sleeper as well,
// and bytes left over from wake-ups a sleeper no longer needed must not
// fill the socket until both sides block writing. A dead peer shows up
// as end-of-file on this side's next wait.
func (e *end) wake(flag *uint32) {
	if atomic.LoadUint32(flag) != 0 && atomic.CompareAndSwapUint32(flag, 1, 0) {
		_ = e.rawConn().Write(func(fd uintptr) bool {
			_ = unix.Sendto(int(fd), wakeByte, unix.MSG_DONTWAIT, nil)
			return true // done, whether sent or not
		})
	}
}

// sleep waits for a wake-up after announcing it in flag, unless ready
// turns true meanwhile. It returns io.EOF once the peer's end is closed.
func (e *end) sleep(flag *uint32, ready func() bool) error {
	if d := time.Duration(e.poll.Load()); d > 0 && spin(d, ready) {
		return nil
	}
	atomic.StoreUint32(flag, 1)
	if ready() {
		atomic.StoreUint32(flag, 0)
		return nil
	}
	_, err := e.conn.Read(e.tok[:])
	atomic.StoreUint32(flag, 0)
	if err != nil && e.closed.Load() {
		return errClosed
	}
	return err
}

// spin polls ready for up to d, yielding the processor between looks so
// that polling never starves another goroutine of this process.
func spin(d time.Duration, ready func() bool) bool {
	until := time.Now().Add(d)
	for i := 0; ; i++ {
		if ready() {
			return true
		}
		if i&63 == 63 {
			if time.Now().After(until) {
				return false
			}
			runtime.Gosched()
		}
	}
}

// Writer is the outbound end of a stream: Write copies into the ring.
type Writer struct {
	end
	head   uint64    // local copy of the shared head
	peeked time.Time // when Write last looked for the reader's end-of-file
}

// readerGone reports whether the reader closed its end (a word it sets)
// or its process ended (its socket's end-of-file, looked for at most
// every millisecond, without blocking and without taking a wake-up).
// A writer would otherwise learn of it only when the ring fills, and a
// peer's links to a worker that went would look up.
func (w *Writer) readerGone() bool {
	if w.readerClosed() {
		return true
	}
	if now := time.Now(); now.Sub(w.peeked) >= time.Millisecond {
		w.peeked = now
		gone := false
		_ = w.rawConn().Read(func(fd uintptr) bool {
			var b [1]byte
			n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			gone = n == 0 && err == nil // end-of-file
			return true
		})
		return gone
	}
	return false
}

// readerClosed says the reader closed its end on purpose.
func (w *Writer) readerClosed() bool { return atomic.LoadUint32(w.r.u32(offReaderClosed)) == 1 }

// readerEnded is Write's error once the reader is gone: ErrReaderClosed
// if it closed its end, else its process died.
func (w *Writer) readerEnded() error {
	if w.readerClosed() {
		return fmt.Errorf("%w: %w", ErrReaderClosed, unix.EPIPE)
	}
	return fmt.Errorf("shared memory: the reader's process ended: %w", unix.EPIPE)
}

// Close closes the stream on purpose: the reader drains it and then
// reads io.EOF, where a writer that died leaves it errPeerEnded.
func (w *Writer) Close() error {
	w.mu.RLock()
	if !w.closed.Load() {
		atomic.StoreUint32(w.r.u32(offWriterClosed), 1)
	}
	w.mu.RUnlock()
	return w.end.Close()
}

// Write copies p into the ring, waiting for room as the reader drains it.
// It fails once the reader's end is closed and the ring is full.
func (w *Writer) Write(p []byte) (int, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	if w.closed.Load() {
		return 0, errClosed
	}
	if w.readerGone() {
		return 0, w.readerEnded()
	}
	r := w.r
	size := uint64(len(r.ring))
	tail := r.u64(offTail)
	written := 0
	for len(p) > 0 {
		used := w.head - atomic.LoadUint64(tail)
		if used > size {
			return written, errCorrupt
		}
		if used == size {
			t := w.head - size
			err := w.sleep(r.u32(offWriterWaiting), func() bool { return atomic.LoadUint64(tail) != t })
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = w.readerEnded()
				}
				return written, err
			}
			continue
		}
		n := copyIn(r.ring, w.head&r.mask, p[:min(uint64(len(p)), size-used)])
		w.head += uint64(n)
		atomic.StoreUint64(r.u64(offHead), w.head)
		w.wake(r.u32(offReaderWaiting))
		p = p[n:]
		written += n
	}
	return written, nil
}

// copyIn copies p into ring at off, wrapping around its end.
func copyIn(ring []byte, off uint64, p []byte) int {
	n := copy(ring[off:], p)
	if n < len(p) {
		n += copy(ring, p[n:])
	}
	return n
}

// Reader is the inbound end of a stream: Read copies out of the ring.
type Reader struct {
	end
	tail uint64 // local copy of the shared tail
}

// Read copies what the ring holds into p, up to len(p), waiting for the
// writer if it is empty. It returns io.EOF once the ring is empty and the
// writer closed its end (drained first, so an orderly close loses
// nothing), and errPeerEnded if the writer's process ended instead.
func (r *Reader) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed.Load() {
		return 0, errClosed
	}
	g := r.r
	size := uint64(len(g.ring))
	head := g.u64(offHead)
	gone := false
	for {
		avail := atomic.LoadUint64(head) - r.tail
		if avail > size {
			return 0, errCorrupt
		}
		if avail > 0 {
			n := copyOut(p[:min(uint64(len(p)), avail)], g.ring, r.tail&g.mask)
			r.tail += uint64(n)
			atomic.StoreUint64(g.u64(offTail), r.tail)
			r.wake(g.u32(offWriterWaiting))
			return n, nil
		}
		if gone {
			if atomic.LoadUint32(g.u32(offWriterClosed)) == 1 {
				return 0, io.EOF
			}
			return 0, errPeerEnded
		}
		t := r.tail
		if err := r.sleep(g.u32(offReaderWaiting), func() bool { return atomic.LoadUint64(head) != t }); err != nil {
			if !errors.Is(err, io.EOF) {
				return 0, err
			}
			gone = true // drain what the writer published before it went
		}
	}
}

// copyOut copies from ring at off into p, wrapping around its end.
func copyOut(p, ring []byte, off uint64) int {
	n := copy(p, ring[off:])
	if n < len(p) {
		n += copy(p[n:], ring)
	}
	return n
}

// Close closes the reader's end, and says so to the writer.
func (r *Reader) Close() error {
	r.mu.RLock()
	if !r.closed.Load() {
		atomic.StoreUint32(r.r.u32(offReaderClosed), 1)
	}
	r.mu.RUnlock()
	return r.end.Close()
}

// SetReadDeadline makes a blocked Read return a timeout error at d; the
// stream stays readable once the deadline is cleared.
func (r *Reader) SetReadDeadline(d time.Time) error { return r.conn.SetReadDeadline(d) }

// SetPoll makes a Read that finds the ring empty poll it for up to d
// before it sleeps (transport.WithPoll).
func (r *Reader) SetPoll(d time.Duration) { r.poll.Store(int64(d)) }
