package secret

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// ServerName is the DNS name in every leaf certificate. Peers are named by
// the certificate's common name, not by address, so one fixed name lets the
// standard verifier check the chain whatever address a peer was dialed at.
const ServerName = "gyre.cluster"

// leafLifetime bounds how long a minted leaf is valid. Leaves are minted at
// process start and never stored.
const leafLifetime = 90 * 24 * time.Hour

// The CA's validity is fixed so that every process derives a byte-identical
// CA certificate from the same secret.
var (
	caNotBefore = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	caNotAfter  = time.Date(2124, 1, 1, 0, 0, 0, 0, time.UTC)
)

var (
	// ErrNoPeerCertificate means a TLS connection carried no peer certificate.
	ErrNoPeerCertificate = errors.New("secret: no peer certificate")
	// ErrUntrusted means a peer certificate does not chain to the cluster CA:
	// the peer holds another secret, or none.
	ErrUntrusted = errors.New("secret: certificate not issued by this cluster's CA")
)

// CA is the cluster certificate authority derived from a Secret.
type CA struct {
	cert *x509.Certificate
	key  ed25519.PrivateKey
	pool *x509.CertPool
}

// CA derives the cluster CA. The same secret always yields the same CA.
func (s Secret) CA() (*CA, error) {
	key := ed25519.NewKeyFromSeed(s.derive("ca seed", ed25519.SeedSize))
	serial := new(big.Int).SetBytes(s.derive("ca serial", 16))
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "gyre cluster CA " + s.Fingerprint()},
		NotBefore:             caNotBefore,
		NotAfter:              caNotAfter,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("secret: create CA: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("secret: parse CA: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &CA{cert: cert, key: key, pool: pool}, nil
}

// Certificate returns the CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Identity is one process's leaf certificate and the CA it trusts.
type Identity struct {
	// Name is the peer ID carried as the leaf's common name.
	Name string
	cert tls.Certificate
	ca   *CA
}

// Issue mints a fresh leaf certificate, with a new Ed25519 key, for name.
func (ca *CA) Issue(name string) (*Identity, error) {
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("secret: identity name must be 1 to 255 bytes, got %d", len(name))
	}
	pub, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("secret: leaf key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("secret: leaf serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{ServerName},
		NotBefore:    now.Add(-time.Hour), // tolerate clock skew between hosts
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("secret: issue leaf: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("secret: parse leaf: %w", err)
	}
	return &Identity{
		Name: name,
		cert: tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf},
		ca:   ca,
	}, nil
}

// ServerTLS returns a TLS 1.3 server config that presents the leaf and
// requires a client certificate chained to the cluster CA. The chain is
// checked in VerifyPeerCertificate rather than by crypto/tls so that a
// refusal can be reported: onReject, if not nil, is called for every
// client refused, with the common name its certificate claims (unverified:
// only for naming the refused peer in errors and logs; "" if none) and the
// reason. quic-go never surfaces failed handshakes to the
// accepting side, so this is the server's only sight of an intruder.
func (id *Identity) ServerTLS(onReject func(claimed string, err error), alpn ...string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		ClientAuth:   tls.RequireAnyClientCert,
		NextProtos:   alpn,
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			_, err := id.ca.verify(raw)
			if err != nil && onReject != nil {
				onReject(claimedName(raw), err)
			}
			return err
		},
	}
}

// ClientTLS returns a TLS 1.3 client config that presents the leaf and
// verifies the server's certificate against the cluster CA.
func (id *Identity) ClientTLS(alpn ...string) *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{id.cert},
		RootCAs:      id.ca.pool,
		ServerName:   ServerName,
		NextProtos:   alpn,
	}
}

// PeerName returns the peer ID of a completed handshake. It verifies the
// peer's leaf against the cluster CA itself, so it is correct whichever
// side of the connection it is called on.
func (id *Identity) PeerName(cs tls.ConnectionState) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", ErrNoPeerCertificate
	}
	raw := make([][]byte, len(cs.PeerCertificates))
	for i, c := range cs.PeerCertificates {
		raw[i] = c.Raw
	}
	return id.ca.verify(raw)
}

// claimedName returns the common name of the leaf in raw without
// verifying it, or "".
func claimedName(raw [][]byte) string {
	if len(raw) == 0 {
		return ""
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return ""
	}
	return leaf.Subject.CommonName
}

// verify checks that raw[0] is a leaf issued by the CA and returns its name.
func (ca *CA) verify(raw [][]byte) (string, error) {
	if len(raw) == 0 {
		return "", ErrNoPeerCertificate
	}
	leaf, err := x509.ParseCertificate(raw[0])
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrUntrusted, err)
	}
	opts := x509.VerifyOptions{Roots: ca.pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}
	if _, err := leaf.Verify(opts); err != nil {
		return "", fmt.Errorf("%w: %q: %v", ErrUntrusted, leaf.Subject.CommonName, err)
	}
	return leaf.Subject.CommonName, nil
}
