package linkbench

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gyre-ml/gyre"
)

// Variant is one Gyre transport setting under test.
type Variant struct {
	Transport string // gyre.TransportQUIC or gyre.TransportTCP
	Insecure  bool   // plain TCP; only with gyre.TransportTCP
}

// The variants `--transport all` selects, in report order.
var (
	VariantQUIC        = Variant{Transport: gyre.TransportQUIC}
	VariantTLS         = Variant{Transport: gyre.TransportTCP}
	VariantTCPInsecure = Variant{Transport: gyre.TransportTCP, Insecure: true}
)

// String names the variant as the report does: "quic", "tcp" or
// "tcp-insecure".
func (v Variant) String() string {
	if v.Insecure {
		return v.Transport + "-insecure"
	}
	return v.Transport
}

// Bare returns the baseline that carries the variant's bytes without Gyre.
func (v Variant) Bare() BareKind {
	switch {
	case v.Transport == gyre.TransportQUIC:
		return BareQUIC
	case v.Insecure:
		return BareTCP
	}
	return BareTLS
}

// SelectVariants returns the variants chosen by --transport (quic, tcp or
// all) and --insecure. "all" measures quic, tcp and tcp-insecure; with tcp,
// --insecure picks plain TCP instead of TLS; quic is always encrypted.
func SelectVariants(transport string, insecure bool) ([]Variant, error) {
	switch transport {
	case "all":
		return []Variant{VariantQUIC, VariantTLS, VariantTCPInsecure}, nil
	case gyre.TransportQUIC:
		if insecure {
			return nil, fmt.Errorf("bench: --insecure needs --transport tcp; quic is always encrypted")
		}
		return []Variant{VariantQUIC}, nil
	case gyre.TransportTCP:
		if insecure {
			return []Variant{VariantTCPInsecure}, nil
		}
		return []Variant{VariantTLS}, nil
	}
	return nil, fmt.Errorf("bench: --transport %q: want quic, tcp or all", transport)
}

// BareKind is a baseline: the same bytes over a bare connection.
type BareKind string

// Baselines, one per variant.
const (
	BareQUIC BareKind = "quic" // one quic-go stream per connection, same certificates and ALPN
	BareTLS  BareKind = "tls"  // crypto/tls 1.3 over TCP, same certificates
	BareTCP  BareKind = "tcp"  // plain TCP
)

// Describe says what the baseline is, for the report.
func (k BareKind) Describe() string {
	switch k {
	case BareQUIC:
		return "bare quic-go stream"
	case BareTLS:
		return "bare crypto/tls connection"
	case BareTCP:
		return "bare TCP connection"
	}
	return string(k)
}

func parseBareKind(s string) (BareKind, error) {
	switch k := BareKind(s); k {
	case BareQUIC, BareTLS, BareTCP:
		return k, nil
	}
	return "", fmt.Errorf("bench: unknown baseline %q", s)
}

// linkKey names one Gyre transport pair in the peer protocol, "quic/2".
func linkKey(v Variant, stripes int) string { return v.String() + "/" + strconv.Itoa(stripes) }

func parseLinkKey(key string) (Variant, int, error) {
	name, s, ok := strings.Cut(key, "/")
	stripes, err := strconv.Atoi(s)
	if !ok || err != nil || stripes < 1 || stripes > gyre.MaxStripes {
		return Variant{}, 0, fmt.Errorf("bench: bad link %q: want VARIANT/STRIPES", key)
	}
	for _, v := range []Variant{VariantQUIC, VariantTLS, VariantTCPInsecure} {
		if v.String() == name {
			return v, stripes, nil
		}
	}
	return Variant{}, 0, fmt.Errorf("bench: bad link %q: unknown variant %q", key, name)
}
