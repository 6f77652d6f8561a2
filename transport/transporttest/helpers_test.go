package transporttest

import (
	"bytes"
	"testing"
)

func TestPattern(t *testing.T) {
	for _, n := range []int{0, 1, 100, 32 << 10, 100<<10 + 3} {
		b := make([]byte, n)
		FillPattern(b, 5)
		if err := CheckPattern(b, 5); err != nil {
			t.Fatalf("%d bytes: %v", n, err)
		}
		if n == 0 {
			continue
		}
		if err := CheckPattern(b, 6); err == nil {
			t.Errorf("%d bytes: the pattern of seed 5 passed as seed 6", n)
		}
		if n > 1 && bytes.Count(b, b[:1]) == n {
			t.Errorf("%d bytes: pattern is one repeated byte", n)
		}
		b[n-1] ^= 1
		if err := CheckPattern(b, 5); err == nil {
			t.Errorf("%d bytes: a flipped last byte went unnoticed", n)
		}
	}
}

func TestTestHeaderFieldsDiffer(t *testing.T) {
	a, b := testHeader(1), testHeader(2)
	if a.Kind == b.Kind || a.Flags == b.Flags || a.DType == b.DType || a.Op == b.Op || a.Algo == b.Algo ||
		a.Epoch == b.Epoch || a.Seq == b.Seq || a.Step == b.Step || a.Chunk == b.Chunk ||
		a.Total == b.Total || a.ChunkSize == b.ChunkSize {
		t.Errorf("headers of consecutive messages share a field:\n%+v\n%+v", a, b)
	}
}

func TestSizeName(t *testing.T) {
	for n, want := range map[int]string{0: "0B", 100: "100B", 4 << 10: "4KiB", 1 << 20: "1MiB", 64 << 20: "64MiB"} {
		if got := SizeName(n); got != want {
			t.Errorf("SizeName(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestIssue(t *testing.T) {
	ca := NewCA(t)
	id := Issue(t, ca, "node-0")
	if id.Name != "node-0" {
		t.Fatalf("Issue: leaf named %q, want node-0", id.Name)
	}
}
