package obs

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gyre-ml/gyre/ring"
)

// TestReadTraceCutShort: the file of a worker killed before Close, read
// from disk as Trace left it at its last boundary and then cut in the
// middle of an event, still reads, without the cut event; garbage does
// not.
func TestReadTraceCutShort(t *testing.T) {
	path := filepath.Join(t.TempDir(), "t.json")
	tr, err := NewTrace(path, 0)
	if err != nil {
		t.Fatal(err)
	}
	tr.Start(1, "w1")
	tr.Collective(ring.CollectiveStats{Algo: ring.AlgoRing, Bytes: 64})
	tr.Boundary(Boundary{Iter: 0, Next: 1, Epoch: 2})
	// No Close: the process dies here. What the boundary flushed is there.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ReadTrace("killed", bytes.NewReader(b))
	if err != nil || len(f.Events) != 6 { // 4 names, the allreduce, the boundary
		t.Fatalf("the file at the last boundary: %d events, %v\n%s", len(f.Events), err, b)
	}
	cut := append(append([]byte(nil), b...), []byte(",\n{\"name\":\"allreduce\",\"ph\":\"X\",\"ts\":17")...)
	if f, err = ReadTrace("cut", bytes.NewReader(cut)); err != nil || len(f.Events) != 6 {
		t.Fatalf("cut mid-event: %d events, %v", len(f.Events), err)
	}
	if _, err := ReadTrace("garbage", strings.NewReader("hello")); err == nil || !strings.Contains(err.Error(), "garbage") {
		t.Fatalf("garbage: %v, want an error naming the file", err)
	}
	tr.Close()
	if f, err = ReadTrace("closed", mustOpen(t, path)); err != nil || len(f.Events) != 6 {
		t.Fatalf("the closed file: %d events, %v", len(f.Events), err)
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestMergeShiftsAndSeparates: the second file is shifted onto the
// first's clock by the median boundary difference (one outlier aside),
// metadata keeps its zero timestamp, and a clashing pid gets a new one.
func TestMergeShiftsAndSeparates(t *testing.T) {
	boundary := func(iter int, end float64) string {
		return `{"name":"boundary","ph":"X","ts":` + jsonNum(end-10) + `,"dur":10,"pid":0,"tid":1,"args":{"iter":` + jsonNum(float64(iter)) + `}}`
	}
	a := TraceFile{Name: "a", Events: raw(`{"name":"process_name","ph":"M","pid":0}`, boundary(1, 1000), boundary(2, 2000), boundary(3, 3000))}
	b := TraceFile{Name: "b", Events: raw(`{"name":"process_name","ph":"M","pid":0}`, boundary(1, 1500), boundary(2, 2500), boundary(3, 9000))}
	merged, offsets, err := Merge([]TraceFile{a, b})
	if err != nil {
		t.Fatal(err)
	}
	if offsets[1].Micros != -500 || offsets[1].Boundaries != 3 || offsets[1].Spread != 5500 {
		t.Fatalf("offset %+v, want -500 µs over 3 boundaries, 5500 µs left at the outlier", offsets[1])
	}
	var last map[string]any
	json.Unmarshal(merged[len(merged)-1], &last)
	if last["pid"] != 1000.0 || last["ts"] != 8490.0 {
		t.Fatalf("b's last boundary merged as %v, want pid 1000 and ts 8990-500", last)
	}
	var meta map[string]any
	json.Unmarshal(merged[4], &meta)
	if _, hasTs := meta["ts"]; hasTs {
		t.Fatalf("metadata gained a timestamp: %v", meta)
	}
	c := TraceFile{Name: "c", Events: raw(boundary(7, 100))}
	if _, _, err := Merge([]TraceFile{a, c}); err == nil || !strings.Contains(err.Error(), "shares no boundary") {
		t.Fatalf("files with no common boundary: %v", err)
	}
}

func raw(events ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(events))
	for i, e := range events {
		out[i] = json.RawMessage(e)
	}
	return out
}

func jsonNum(v float64) string { b, _ := json.Marshal(v); return string(b) }
