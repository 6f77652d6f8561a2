//go:build !linux

package bench

import "net"

// forceBuffers does nothing where the buffers cannot be forced.
func forceBuffers(*net.UDPConn, int) {}
