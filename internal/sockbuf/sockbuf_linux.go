package sockbuf

import (
	"net"
	"syscall"
)

// force raises the buffers past the sysctl limits with SO_RCVBUFFORCE and
// SO_SNDBUFFORCE where they are still below size, which need CAP_NET_ADMIN
// and are harmlessly refused otherwise, and returns the sizes the kernel
// granted.
func force(c *net.UDPConn, size int) (rcv, snd int, err error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		s := int(fd)
		if cur, _ := syscall.GetsockoptInt(s, syscall.SOL_SOCKET, syscall.SO_RCVBUF); cur < 2*size {
			_ = syscall.SetsockoptInt(s, syscall.SOL_SOCKET, syscall.SO_RCVBUFFORCE, size)
		}
		if cur, _ := syscall.GetsockoptInt(s, syscall.SOL_SOCKET, syscall.SO_SNDBUF); cur < 2*size {
			_ = syscall.SetsockoptInt(s, syscall.SOL_SOCKET, syscall.SO_SNDBUFFORCE, size)
		}
		rcv, serr = syscall.GetsockoptInt(s, syscall.SOL_SOCKET, syscall.SO_RCVBUF)
		if serr == nil {
			snd, serr = syscall.GetsockoptInt(s, syscall.SOL_SOCKET, syscall.SO_SNDBUF)
		}
	})
	if err == nil {
		err = serr
	}
	return rcv, snd, err
}
