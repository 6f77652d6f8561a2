package secret

import (
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// Size is the length of a cluster secret in bytes.
const Size = 32

// maxFileSize bounds how much of a key file is read.
const maxFileSize = 4 << 10

// hkdfSalt versions every derivation: a new salt gives new keys.
var hkdfSalt = []byte("gyre/v1")

// Secret is a cluster secret. Its String method hides the key, so it is safe
// to log or print by accident.
type Secret struct {
	key [Size]byte
}

// ErrBadSecret is wrapped by errors about a secret that cannot be parsed.
var ErrBadSecret = errors.New("secret: bad cluster secret")

// Generate returns a new random secret.
func Generate() (Secret, error) {
	var s Secret
	if _, err := io.ReadFull(rand.Reader, s.key[:]); err != nil {
		return Secret{}, fmt.Errorf("secret: generate: %w", err)
	}
	return s, nil
}

// Parse decodes a hex-encoded secret. Surrounding whitespace is ignored.
func Parse(text string) (Secret, error) {
	text = strings.TrimSpace(text)
	if len(text) != 2*Size {
		return Secret{}, fmt.Errorf("%w: want %d hex digits, got %d characters", ErrBadSecret, 2*Size, len(text))
	}
	var s Secret
	if _, err := hex.Decode(s.key[:], []byte(text)); err != nil {
		return Secret{}, fmt.Errorf("%w: %v", ErrBadSecret, err)
	}
	return s, nil
}

// Load reads a hex-encoded secret from a file written by WriteFile.
func Load(path string) (Secret, error) {
	f, err := os.Open(path)
	if err != nil {
		return Secret{}, fmt.Errorf("secret: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return Secret{}, fmt.Errorf("secret: read %s: %w", path, err)
	}
	if len(b) > maxFileSize {
		return Secret{}, fmt.Errorf("%w: %s is larger than %d bytes", ErrBadSecret, path, maxFileSize)
	}
	s, err := Parse(string(b))
	if err != nil {
		return Secret{}, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// WriteFile writes the secret, hex-encoded, to a new file readable only by
// its owner. It refuses to overwrite an existing file, so a typo cannot
// destroy the key a running job depends on.
func (s Secret) WriteFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("secret: %w", err)
	}
	if _, err := f.WriteString(s.Hex() + "\n"); err != nil {
		f.Close()
		return fmt.Errorf("secret: write %s: %w", path, err)
	}
	return f.Close()
}

// Hex returns the secret hex-encoded, the form keygen writes.
func (s Secret) Hex() string { return hex.EncodeToString(s.key[:]) }

// String hides the secret; it shows the fingerprint instead.
func (s Secret) String() string { return "secret(" + s.Fingerprint() + ")" }

// IsZero reports whether s is the zero value (no secret).
func (s Secret) IsZero() bool { return s.key == [Size]byte{} }

// Fingerprint returns a short public name for the secret, derived one-way,
// so logs can show whether two processes hold the same secret.
func (s Secret) Fingerprint() string { return hex.EncodeToString(s.derive("fingerprint", 6)) }

// GossipKey returns the 32-byte memberlist encryption key (AES-256-GCM).
func (s Secret) GossipKey() []byte { return s.derive("gossip key", 32) }

// ResetKey returns the QUIC stateless-reset key for the endpoint named
// endpoint. Deriving it from the secret, rather than drawing it at random,
// lets a restarted worker at the same name reset its peers' stale
// connections at once instead of leaving them to the idle timeout.
func (s Secret) ResetKey(endpoint string) [32]byte {
	return [32]byte(s.derive("quic reset key "+endpoint, 32))
}

func (s Secret) derive(info string, n int) []byte {
	k, err := hkdf.Key(sha256.New, s.key[:], hkdfSalt, "gyre "+info, n)
	if err != nil {
		// Only reachable with n beyond 255*32 bytes, a programming error.
		panic("secret: hkdf: " + err.Error())
	}
	return k
}
