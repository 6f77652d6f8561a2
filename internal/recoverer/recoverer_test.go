package recoverer

import (
	"strings"
	"testing"
)

// TestUnheard: a worker without quorum names the voters it does not
// hear, and never claims not to hear when it hears them all.
func TestUnheard(t *testing.T) {
	if got := unheard([]string{"rank 2 a", "rank 3 b"}); got != "it does not hear rank 2 a, rank 3 b" {
		t.Errorf("two unheard: %q", got)
	}
	if got := unheard(nil); strings.Contains(got, "does not hear") || !strings.Contains(got, "hears every one") {
		t.Errorf("none unheard: %q", got)
	}
}
