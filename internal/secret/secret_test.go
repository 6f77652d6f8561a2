package secret

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mustGenerate(tb testing.TB) Secret {
	tb.Helper()
	s, err := Generate()
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestParseRoundTrip(t *testing.T) {
	s := mustGenerate(t)
	got, err := Parse("  " + s.Hex() + "\n")
	if err != nil {
		t.Fatal(err)
	}
	if got != s {
		t.Fatal("parsed secret differs from the original")
	}
	if strings.Contains(s.String(), s.Hex()) {
		t.Fatal("String leaks the secret")
	}
}

func TestParseRejects(t *testing.T) {
	for name, text := range map[string]string{
		"empty":   "",
		"short":   strings.Repeat("ab", Size-1),
		"long":    strings.Repeat("ab", Size+1),
		"not hex": strings.Repeat("zz", Size),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := Parse(text); !errors.Is(err, ErrBadSecret) {
				t.Fatalf("Parse(%q) = %v, want ErrBadSecret", text, err)
			}
		})
	}
}

func TestWriteFileLoad(t *testing.T) {
	s := mustGenerate(t)
	path := filepath.Join(t.TempDir(), "key")
	if err := s.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Fatalf("key file mode %o, want 600", perm)
	}
	got, err := Load(path)
	if err != nil || got != s {
		t.Fatalf("Load = %v, %v; want the written secret", got, err)
	}
	if err := mustGenerate(t).WriteFile(path); !errors.Is(err, os.ErrExist) {
		t.Fatalf("overwriting a key file: %v, want os.ErrExist", err)
	}
	big := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("a"), maxFileSize+10), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); !errors.Is(err, ErrBadSecret) {
		t.Fatalf("Load(oversize) = %v, want ErrBadSecret", err)
	}
}

func TestDerivationsAreDeterministicAndIndependent(t *testing.T) {
	a, b := mustGenerate(t), mustGenerate(t)
	if !bytes.Equal(a.GossipKey(), a.GossipKey()) || len(a.GossipKey()) != 32 {
		t.Fatal("gossip key is not a stable 32-byte key")
	}
	if bytes.Equal(a.GossipKey(), b.GossipKey()) {
		t.Fatal("different secrets give the same gossip key")
	}
	ca1, err := a.CA()
	if err != nil {
		t.Fatal(err)
	}
	ca2, _ := a.CA()
	if !bytes.Equal(ca1.Certificate().Raw, ca2.Certificate().Raw) {
		t.Fatal("the same secret gives different CA certificates")
	}
	k := a.ResetKey("w0")
	if k != a.ResetKey("w0") || k == a.ResetKey("w1") || k == b.ResetKey("w0") {
		t.Fatal("reset keys are not stable per endpoint and distinct across endpoints and secrets")
	}
	if a.Fingerprint() == b.Fingerprint() {
		t.Fatal("different secrets share a fingerprint")
	}
}

// handshake runs a TLS handshake between a client and a server identity over
// an in-memory pipe and returns each side's error and the names they saw.
func handshake(t *testing.T, client, server *Identity) (clientErr, serverErr error, clientSaw, serverSaw string, rejected []error) {
	t.Helper()
	c, s := tcpPair(t)
	defer c.Close()
	defer s.Close()
	deadline := time.Now().Add(5 * time.Second)
	c.SetDeadline(deadline)
	s.SetDeadline(deadline)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tc := tls.Server(s, server.ServerTLS(func(_ string, err error) { rejected = append(rejected, err) }, "gyre/1"))
		if serverErr = tc.Handshake(); serverErr == nil {
			serverSaw, serverErr = server.PeerName(tc.ConnectionState())
		}
		s.Close()
	}()
	tc := tls.Client(c, client.ClientTLS("gyre/1"))
	if clientErr = tc.Handshake(); clientErr == nil {
		clientSaw, clientErr = client.PeerName(tc.ConnectionState())
	}
	c.Close()
	<-done
	return
}

// tcpPair returns the two ends of a loopback TCP connection. Unlike
// net.Pipe's, its writes are buffered: a side that refuses the other's
// certificate can send its alert while the other is still writing its
// flight, where net.Pipe would hold both until the deadline.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		s, _ := ln.Accept() // nil if Dial failed, which Fatal reports
		accepted <- s
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		c.Close()
		t.Fatal("accept failed")
	}
	return c, s
}

// handshakeSkipVerify is handshake with a client that does not check the
// server, to reach the server's own check of the client.
func handshakeSkipVerify(t *testing.T, client, server *Identity) (error, error, string, string, []error) {
	t.Helper()
	orig := client.ca
	client.ca = server.ca // trust the server's CA; the leaf still carries the wrong chain
	defer func() { client.ca = orig }()
	return handshake(t, client, server)
}

func issue(t *testing.T, s Secret, name string) *Identity {
	t.Helper()
	ca, err := s.CA()
	if err != nil {
		t.Fatal(err)
	}
	id, err := ca.Issue(name)
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func TestMutualTLSSameSecret(t *testing.T) {
	s := mustGenerate(t)
	cerr, serr, csaw, ssaw, _ := handshake(t, issue(t, s, "w0"), issue(t, s, "w1"))
	if cerr != nil || serr != nil {
		t.Fatalf("handshake failed: client %v, server %v", cerr, serr)
	}
	if csaw != "w1" || ssaw != "w0" {
		t.Fatalf("peer names: client saw %q, server saw %q", csaw, ssaw)
	}
}

func TestMutualTLSWrongSecretRefused(t *testing.T) {
	good, bad := mustGenerate(t), mustGenerate(t)
	t.Run("client without secret", func(t *testing.T) {
		// The intruder's client cannot verify the server either, so it aborts
		// first unless it skips verification, as an attacker would.
		intruder := issue(t, bad, "intruder")
		_, serr, _, _, rejected := handshakeSkipVerify(t, intruder, issue(t, good, "w0"))
		if serr == nil {
			t.Fatal("server accepted a client from another cluster")
		}
		if len(rejected) != 1 || !errors.Is(rejected[0], ErrUntrusted) {
			t.Fatalf("server reported rejections %v, want one ErrUntrusted", rejected)
		}
	})
	t.Run("server without secret", func(t *testing.T) {
		cerr, _, _, _, _ := handshake(t, issue(t, good, "w0"), issue(t, bad, "intruder"))
		if cerr == nil {
			t.Fatal("client accepted a server from another cluster")
		}
	})
}

func TestIssueRejectsBadNames(t *testing.T) {
	ca, err := mustGenerate(t).CA()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", strings.Repeat("x", 256)} {
		if _, err := ca.Issue(name); err == nil {
			t.Fatalf("Issue(%d bytes) succeeded", len(name))
		}
	}
}
