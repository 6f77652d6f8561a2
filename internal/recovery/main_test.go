package recovery

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestMain lets the heap grow to five times the live data before a
// collection (GOGC=400) unless GOGC is set: the simulator makes garbage
// at every step and keeps little, and collecting it took a fifth of the
// explorations' CPU.
func TestMain(m *testing.M) {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	os.Exit(m.Run())
}
