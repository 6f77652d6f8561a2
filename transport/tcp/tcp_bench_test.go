package tcp

import (
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/gyre-ml/gyre/transport/transporttest"
)

// Each Gyre benchmark is paired with a bare baseline carrying the same
// bytes on one plain connection of the same kind (crypto/tls over TCP, or
// TCP), with no framing, hello or core. The difference is what Gyre costs.

var benchSizes = []int{4 << 10, 1 << 20, 64 << 20}

func modeName(insecure bool) string {
	if insecure {
		return "tcp"
	}
	return "tls"
}

func BenchmarkOneWay(b *testing.B) {
	for _, insecure := range []bool{false, true} {
		for _, k := range []int{1, 2} {
			for _, size := range benchSizes {
				if k > 1 && size < stripeBenchMin {
					continue // below the striping threshold: same as k=1
				}
				b.Run(fmt.Sprintf("%s/stripes=%d/%s", modeName(insecure), k, transporttest.SizeName(size)), func(b *testing.B) {
					nodes := newNodes(insecure, func(c *Config) { c.Stripes = k })(b, 2)
					transporttest.BenchmarkOneWay(b, nodes, size)
				})
			}
		}
	}
}

// stripeBenchMin skips striped runs of sizes that are never striped.
const stripeBenchMin = 256 << 10

func BenchmarkRoundTrip(b *testing.B) {
	for _, insecure := range []bool{false, true} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("%s/%s", modeName(insecure), transporttest.SizeName(size)), func(b *testing.B) {
				nodes := newNodes(insecure, nil)(b, 2)
				transporttest.BenchmarkRoundTrip(b, nodes, size)
			})
		}
	}
}

// barePair returns the two ends of one connection: TLS with the same
// certificates and settings as the transport, or plain TCP.
func barePair(b testing.TB, insecure bool) (client, server net.Conn) {
	b.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		b.Fatal("accept failed")
	}
	b.Cleanup(func() { c.Close(); s.Close() })
	if insecure {
		return c, s
	}
	ca := transporttest.NewCA(b)
	sc := transporttest.Issue(b, ca, "server").ServerTLS(nil, ALPN)
	sc.SessionTicketsDisabled = true
	tc, ts := tls.Client(c, transporttest.Issue(b, ca, "client").ClientTLS(ALPN)), tls.Server(s, sc)
	done := make(chan error, 1)
	go func() { done <- ts.Handshake() }()
	if err := tc.Handshake(); err != nil {
		b.Fatal(err)
	}
	if err := <-done; err != nil {
		b.Fatal(err)
	}
	return tc, ts
}

// BenchmarkBareOneWay streams size bytes per op over one connection.
func BenchmarkBareOneWay(b *testing.B) {
	for _, insecure := range []bool{false, true} {
		for _, size := range benchSizes {
			b.Run(fmt.Sprintf("%s/%s", modeName(insecure), transporttest.SizeName(size)), func(b *testing.B) {
				src, dst := barePair(b, insecure)
				payload, buf := make([]byte, size), make([]byte, size)
				b.SetBytes(int64(size))
				b.ReportAllocs()
				n := b.N
				b.ResetTimer()
				sent := make(chan error, 1)
				go func() {
					for range n {
						if _, err := src.Write(payload); err != nil {
							sent <- err
							return
						}
					}
					sent <- nil
				}()
				for range n {
					if _, err := io.ReadFull(dst, buf); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				if err := <-sent; err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkBareRoundTrip bounces a 4 KiB message over one connection.
func BenchmarkBareRoundTrip(b *testing.B) {
	const size = 4 << 10
	for _, insecure := range []bool{false, true} {
		b.Run(fmt.Sprintf("%s/%s", modeName(insecure), transporttest.SizeName(size)), func(b *testing.B) {
			src, dst := barePair(b, insecure)
			payload, buf, echo := make([]byte, size), make([]byte, size), make([]byte, size)
			b.ReportAllocs()
			n := b.N
			b.ResetTimer()
			echoed := make(chan error, 1)
			go func() {
				for range n {
					if _, err := io.ReadFull(dst, echo); err != nil {
						echoed <- err
						return
					}
					if _, err := dst.Write(echo); err != nil {
						echoed <- err
						return
					}
				}
				echoed <- nil
			}()
			for range n {
				if _, err := src.Write(payload); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(src, buf); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if err := <-echoed; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkSharedMemory runs both benchmarks between two nodes of this
// process over the shared-memory path, with and without polling.
func BenchmarkSharedMemory(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("OneWay/"+transporttest.SizeName(size), func(b *testing.B) {
			nodes := newNodes(false, func(c *Config) { c.SharedMemory = true })(b, 2)
			transporttest.BenchmarkOneWay(b, nodes, size)
		})
		b.Run("RoundTrip/"+transporttest.SizeName(size), func(b *testing.B) {
			nodes := newNodes(false, func(c *Config) { c.SharedMemory = true })(b, 2)
			transporttest.BenchmarkRoundTrip(b, nodes, size)
		})
	}
}
