// Package transporttest is the conformance suite and benchmark kit shared by
// every transport.Transport implementation.
//
// An implementation's tests call Run with a factory that makes fresh,
// unconnected transports that can reach each other (quic and tcp on
// loopback, mem in process). Run then checks the contract written on
// transport.Transport: whole, ordered, intact messages per (peer, channel);
// independent channels; typed errors; prompt cancellation, close and
// peer-gone; no leaked goroutines. Every blocking call in the suite carries
// a context deadline, so a broken transport fails its test rather than
// hanging it.
//
// BenchmarkOneWay and BenchmarkRoundTrip measure the same two things for
// every transport, so their numbers can be compared side by side.
//
// The rest serves the transports' own tests: certificates from a fresh
// cluster secret (NewCA, Issue), logs written to the test or kept for
// assertions (Logger, LogBuffer), heap measurement (HeapObjectsBytes) and
// sub-benchmark names (SizeName).
package transporttest
