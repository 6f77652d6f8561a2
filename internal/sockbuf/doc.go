// Package sockbuf enlarges UDP socket buffers for QUIC.
//
// At a few hundred MB/s a burst of packets overruns the usual 208 KiB
// kernel default before quic-go's reader runs, and every loss costs a
// retransmission and a congestion-window cut. The quic transport and the
// bare QUIC baseline in bench both ask for Size here, so that the
// benchmark compares like with like.
package sockbuf
