package linkbench

import (
	"slices"
	"testing"
	"time"
)

func TestSelectVariants(t *testing.T) {
	tests := []struct {
		transport string
		insecure  bool
		want      []string // nil: an error
	}{
		{"all", false, []string{"quic", "tcp", "tcp-insecure"}},
		{"all", true, []string{"quic", "tcp", "tcp-insecure"}},
		{"quic", false, []string{"quic"}},
		{"quic", true, nil},
		{"tcp", false, []string{"tcp"}},
		{"tcp", true, []string{"tcp-insecure"}},
		{"udp", false, nil},
	}
	for _, tt := range tests {
		vs, err := SelectVariants(tt.transport, tt.insecure)
		if tt.want == nil {
			if err == nil {
				t.Errorf("SelectVariants(%q, %v) = %v, want an error", tt.transport, tt.insecure, vs)
			}
			continue
		}
		var got []string
		for _, v := range vs {
			got = append(got, v.String())
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("SelectVariants(%q, %v) = %v, %v; want %v", tt.transport, tt.insecure, got, err, tt.want)
		}
	}
}

func TestBareKinds(t *testing.T) {
	for v, want := range map[Variant]BareKind{VariantQUIC: BareQUIC, VariantTLS: BareTLS, VariantTCPInsecure: BareTCP} {
		if got := v.Bare(); got != want {
			t.Errorf("%s.Bare() = %s, want %s", v, got, want)
		}
	}
}

func TestLinkKey(t *testing.T) {
	for _, v := range []Variant{VariantQUIC, VariantTLS, VariantTCPInsecure} {
		for _, s := range []int{1, 4, 16} {
			gv, gs, err := parseLinkKey(linkKey(v, s))
			if err != nil || gv != v || gs != s {
				t.Errorf("parseLinkKey(%q) = %v, %d, %v", linkKey(v, s), gv, gs, err)
			}
		}
	}
	for _, bad := range []string{"", "quic", "quic/0", "quic/17", "udp/1", "quic/x"} {
		if _, _, err := parseLinkKey(bad); err == nil {
			t.Errorf("parseLinkKey(%q) succeeded", bad)
		}
	}
}

func TestPeerSpecArgs(t *testing.T) {
	s := PeerSpec{
		Links:    map[string]string{"tcp/2": "127.0.0.1:2", "quic/1": "127.0.0.1:1"},
		Bare:     []BareKind{BareQUIC, BareTLS},
		Deadline: 90 * time.Second,
	}
	want := []string{
		"--link", "quic/1=127.0.0.1:1", "--link", "tcp/2=127.0.0.1:2",
		"--bare", "quic", "--bare", "tls", "--deadline", "1m30s",
	}
	if got := s.Args(); !slices.Equal(got, want) {
		t.Fatalf("Args() = %q, want %q", got, want)
	}
}

func TestCommandChecks(t *testing.T) {
	c := command{op: opOneWay, count: 20, size: 64 << 20}
	if got := decodeCommand(c.encode()); got != c {
		t.Fatalf("decode(encode(%v)) = %v", c, got)
	}
	if got := commandOf(c.header()); got != c {
		t.Fatalf("commandOf(header(%v)) = %v", c, got)
	}
	for _, bad := range []command{{op: 0}, {op: 99}, {op: opOneWay, size: MaxMessage + 1}} {
		if err := bad.check(); err == nil {
			t.Errorf("check(%v) passed", bad)
		}
	}
}
