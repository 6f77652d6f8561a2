package engine

import (
	"strings"
	"testing"
	"time"
)

// TestLeftOutBecause: only a worker that stalled past the peer timeout is
// told it was stopped or starved.
func TestLeftOutBecause(t *testing.T) {
	stopped := leftOutBecause(15*time.Second, time.Second)
	if !strings.Contains(stopped, "stopped or starved of CPU for 15s") {
		t.Errorf("a worker stopped for 15 s is told %q", stopped)
	}
	never := leftOutBecause(0, time.Second)
	if strings.Contains(never, "stopped or starved") || !strings.Contains(never, "did not stall") {
		t.Errorf("a worker that never stalled is told %q; want that it did not stall", never)
	}
}
