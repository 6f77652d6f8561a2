package view

import (
	"slices"
	"testing"

	"github.com/gyre-ml/gyre/internal/vote"
)

func TestHosts(t *testing.T) {
	v := &View{Members: []vote.Member{{Addr: "127.0.0.1:7947"}, {Addr: "[::1]:7947"}, {Addr: "r2"}}}
	if got := v.Hosts(); !slices.Equal(got, []string{"127.0.0.1", "::1", "r2"}) {
		t.Errorf("hosts %q", got)
	}
}
