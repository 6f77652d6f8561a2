package refusals

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gyre-ml/gyre/transport"
)

func TestLogKeepsTheNewest(t *testing.T) {
	var l Log
	if got := l.List(); len(got) != 0 {
		t.Fatalf("empty log lists %v", got)
	}
	for i := range keep + 10 {
		l.Add(fmt.Sprintf("10.0.0.1:%d", i), fmt.Sprintf("w%d", i), errors.New("untrusted"))
	}
	got := l.List()
	if len(got) != keep || got[0].Claimed != "w10" || got[keep-1].Claimed != transport.PeerID(fmt.Sprintf("w%d", keep+9)) {
		t.Fatalf("kept %d, first %q, last %q", len(got), got[0].Claimed, got[len(got)-1].Claimed)
	}
	if l.Total() != keep+10 {
		t.Fatalf("Total() = %d after %d refusals", l.Total(), keep+10)
	}
	if !errors.Is(got[0].Err, transport.ErrUnauthenticated) {
		t.Fatalf("Err = %v, want ErrUnauthenticated", got[0].Err)
	}
}
