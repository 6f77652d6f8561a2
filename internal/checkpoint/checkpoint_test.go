package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func sample(epoch uint64, iter int64) *Snapshot {
	f32 := []float32{1, -2.5, float32(math.Inf(1)), 3e-38}
	f64 := []float64{math.Pi, math.Copysign(0, -1), 1e300, float64(iter)}
	meta := []byte("step=42")
	return &Snapshot{
		Header: Header{Epoch: epoch, Iter: iter, Workers: 4,
			Settings: []Setting{{Name: "global_batch", Value: "256"}},
			Entries:  []Entry{{"w", Float32, len(f32)}, {"m", Float64, len(f64)}, {"steps", Bytes, len(meta)}},
			Balance:  json.RawMessage(`{"fits":[1,2]}`),
			Written:  time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)},
		Values: []Value{{F32: f32}, {F64: f64}, {Bytes: meta}},
	}
}

func encode(t *testing.T, s *Snapshot) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := Encode(&b, s); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestRoundTrip(t *testing.T) {
	s := sample(3, 120)
	b := encode(t, s)
	got, err := Decode(bytes.NewReader(b), int64(len(b)), "x")
	if err != nil {
		t.Fatal(err)
	}
	if got.Epoch != 3 || got.Iter != 120 || got.Workers != 4 || got.Sum != s.Sum || got.Sum == 0 || !got.Written.Equal(s.Written) ||
		!slices.Equal(got.Entries, s.Entries) || !slices.Equal(got.Settings, s.Settings) || string(got.Balance) != string(s.Balance) {
		t.Fatalf("header %+v, wrote %+v", got.Header, s.Header)
	}
	for i, v := range got.Values {
		w := s.Values[i]
		// Bit patterns, so that -0 and Inf count.
		if !slices.Equal(bits32(v.F32), bits32(w.F32)) || !slices.Equal(bits64(v.F64), bits64(w.F64)) || !bytes.Equal(v.Bytes, w.Bytes) {
			t.Fatalf("entry %d: read %+v, wrote %+v", i, v, w)
		}
	}
	if !bytes.HasPrefix(b, []byte("GYRECKP\x00")) || !bytes.Contains(b, []byte(`"global_batch"`)) {
		t.Fatalf("the file does not open with the magic and a readable header: %q", b[:40])
	}
}

func bits32(s []float32) []uint32 {
	out := make([]uint32, len(s))
	for i, x := range s {
		out[i] = math.Float32bits(x)
	}
	return out
}

func bits64(s []float64) []uint64 {
	out := make([]uint64, len(s))
	for i, x := range s {
		out[i] = math.Float64bits(x)
	}
	return out
}

// TestEveryDamageIsCaught: every truncation of a file, and every single
// flipped bit of it, is refused as corrupt (or, in the version field, as
// a version this build does not read): no damaged file reads as valid.
func TestEveryDamageIsCaught(t *testing.T) {
	b := encode(t, sample(1, 7))
	for n := range len(b) {
		if _, err := Decode(bytes.NewReader(b[:n]), int64(n), "cut"); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated to %d of %d bytes: %v, want ErrCorrupt", n, len(b), err)
		}
		if _, err := Check(bytes.NewReader(b[:n]), int64(n), "cut"); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Check of a file truncated to %d of %d bytes: %v, want ErrCorrupt", n, len(b), err)
		}
	}
	for i := range len(b) {
		for bit := range 8 {
			d := slices.Clone(b)
			d[i] ^= 1 << bit
			_, err := Decode(bytes.NewReader(d), int64(len(d)), "flipped")
			if err == nil {
				t.Fatalf("bit %d of byte %d flipped: read as valid", bit, i)
			}
			if !errors.Is(err, ErrCorrupt) && !strings.Contains(err.Error(), "format version") {
				t.Fatalf("bit %d of byte %d flipped: %v", bit, i, err)
			}
		}
	}
}

func TestEncodeRefusesValuesThatDoNotMatch(t *testing.T) {
	s := sample(1, 1)
	s.Values[1].F64 = s.Values[1].F64[:2]
	if err := Encode(io.Discard, s); err == nil || !strings.Contains(err.Error(), `"m"`) {
		t.Fatalf("Encode = %v, want an error naming entry m", err)
	}
}

func TestNames(t *testing.T) {
	n := FileName(2, 40)
	if e, i, ok := parseName(n); !ok || e != 2 || i != 40 {
		t.Fatalf("parseName(%q) = %d %d %v", n, e, i, ok)
	}
	for _, bad := range []string{"ckpt-e2-i40.gyre", "ckpt-e00000000000000000002-i00000000000000000040.gyre.tmp", ".ckpt-x~1.tmp", "worker-a.marker", "ckpt-ex-iy.gyre"} {
		if _, _, ok := parseName(bad); ok {
			t.Errorf("parseName(%q) took it for a checkpoint", bad)
		}
	}
	// Names sort as (epoch, iteration) do.
	if !(FileName(1, 900) < FileName(2, 3) && FileName(2, 3) < FileName(2, 10)) {
		t.Error("file names do not sort as (epoch, iteration)")
	}
}

func TestDirWriteListPrune(t *testing.T) {
	d := Dir{Path: t.TempDir(), Owner: "127.0.0.1:7000"}
	for _, ei := range [][2]int64{{1, 20}, {1, 40}, {2, 40}, {2, 60}} {
		name, err := d.Write(sample(uint64(ei[0]), ei[1]))
		if err != nil {
			t.Fatal(err)
		}
		st, err := os.Stat(filepath.Join(d.Path, name))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want 0600", name, err, st.Mode())
		}
	}
	infos, err := d.List()
	if err != nil {
		t.Fatal(err)
	}
	var got [][2]int64
	for _, in := range infos {
		got = append(got, [2]int64{int64(in.Epoch), in.Iter})
	}
	if want := [][2]int64{{2, 60}, {2, 40}, {1, 40}, {1, 20}}; !slices.Equal(got, want) {
		t.Fatalf("List = %v, want newest first %v", got, want)
	}
	// A temporary file this owner left when it died goes; another
	// owner's fresh one stays, as that worker may be writing it.
	mine := filepath.Join(d.Path, ".ckpt-127.0.0.1_7000~123.tmp")
	theirs := filepath.Join(d.Path, ".ckpt-127.0.0.1_70001~9.tmp")
	for _, p := range []string{mine, theirs} {
		if err := os.WriteFile(p, []byte("partial"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.Prune(2); err != nil {
		t.Fatal(err)
	}
	infos, _ = d.List()
	if len(infos) != 2 || infos[0].Iter != 60 || infos[1].Iter != 40 || infos[1].Epoch != 2 {
		t.Fatalf("after Prune(2): %v", infos)
	}
	if _, err := os.Stat(mine); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("this owner's stale temporary file is still there: %v", err)
	}
	if _, err := os.Stat(theirs); err != nil {
		t.Errorf("another owner's temporary file was removed: %v", err)
	}
}

// TestNewestSkipsDamagedFiles: the newest checkpoint truncated, the next
// one with a flipped byte: Newest returns the third, naming both.
func TestNewestSkipsDamagedFiles(t *testing.T) {
	d := Dir{Path: t.TempDir(), Owner: "w"}
	for _, it := range []int64{20, 40, 60} {
		if _, err := d.Write(sample(1, it)); err != nil {
			t.Fatal(err)
		}
	}
	newest := filepath.Join(d.Path, FileName(1, 60))
	st, _ := os.Stat(newest)
	if err := os.Truncate(newest, st.Size()/2); err != nil {
		t.Fatal(err)
	}
	second := filepath.Join(d.Path, FileName(1, 40))
	b, _ := os.ReadFile(second)
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(second, b, 0o600); err != nil {
		t.Fatal(err)
	}
	s, name, bad := d.Newest()
	if s == nil || name != FileName(1, 20) || s.Iter != 20 || s.Values != nil || s.Sum == 0 {
		t.Fatalf("Newest = %v %q, want iteration 20, checked, its values not kept", s, name)
	}
	if e := d.HighestEpoch(); e != 1 {
		t.Fatalf("HighestEpoch = %d, want 1", e)
	}
	if len(bad) != 2 || !strings.Contains(bad[0].Error(), newest) || !strings.Contains(bad[1].Error(), second) {
		t.Fatalf("Newest's errors %v; want the truncated and the damaged file, named", bad)
	}
	if s, _, bad := (Dir{Path: filepath.Join(d.Path, "none")}).Newest(); s != nil || len(bad) != 0 {
		t.Fatalf("a missing directory: %v %v, want no checkpoint and no error", s, bad)
	}
}

// TestRenamedFileIsRefused: a valid file under another checkpoint's name
// is refused, so that a copy made by hand cannot pass for a newer one.
func TestRenamedFileIsRefused(t *testing.T) {
	d := Dir{Path: t.TempDir(), Owner: "w"}
	name, err := d.Write(sample(1, 20))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(d.Path, name), filepath.Join(d.Path, FileName(1, 80))); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Load(FileName(1, 80)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Load of a renamed file = %v, want ErrCorrupt", err)
	}
}

// TestFailedWriteLeavesNothing: a write into a directory that does not
// exist fails, and one that fails midway (a value that does not match
// its entry) leaves neither a checkpoint nor a temporary file.
func TestFailedWriteLeavesNothing(t *testing.T) {
	d := Dir{Path: t.TempDir(), Owner: "w"}
	bad := sample(1, 20)
	bad.Values[0].F32 = bad.Values[0].F32[:1]
	if _, err := d.Write(bad); err == nil {
		t.Fatal("a write of a snapshot whose values do not match its entries succeeded")
	}
	ents, _ := os.ReadDir(d.Path)
	if len(ents) != 0 {
		t.Fatalf("a failed write left %v", ents)
	}
	if _, err := (Dir{Path: filepath.Join(d.Path, "gone")}).Write(sample(1, 20)); err == nil {
		t.Fatal("a write into a missing directory succeeded")
	}
}

func TestMarkers(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "ckpt")}
	for _, id := range []string{"127.0.0.1:7001", "127.0.0.1:7002"} {
		if err := d.Mark(id); err != nil {
			t.Fatal(err)
		}
	}
	ids, err := d.Marked()
	if err != nil || len(ids) != 2 || !ids["127.0.0.1:7001"] || !ids["127.0.0.1:7002"] {
		t.Fatalf("Marked = %v, %v", ids, err)
	}
	if infos, err := d.List(); err != nil || len(infos) != 0 {
		t.Fatalf("markers listed as checkpoints: %v %v", infos, err)
	}
}

// TestWriterOneAtATime: Start refuses a second snapshot while the first
// is written, reports each write once, and says Busy until the report is
// made.
func TestWriterOneAtATime(t *testing.T) {
	d := Dir{Path: t.TempDir(), Owner: "w"}
	var mu sync.Mutex
	var results []Result
	release := make(chan struct{})
	w := NewWriter(d, 1, func(r Result) {
		<-release
		mu.Lock()
		results = append(results, r)
		mu.Unlock()
	})
	if !w.Start(sample(1, 20), nil) {
		t.Fatal("Start refused the first snapshot")
	}
	if w.Start(sample(1, 40), nil) || !w.Busy() {
		t.Fatal("Start took a second snapshot while the first was written")
	}
	close(release)
	w.Wait()
	if w.Busy() {
		t.Fatal("Busy after Wait")
	}
	if !w.Start(sample(1, 60), nil) {
		t.Fatal("Start refused a snapshot once the writer was free")
	}
	w.Wait()
	mu.Lock()
	defer mu.Unlock()
	if len(results) != 2 || results[0].Err != nil || results[1].Err != nil || results[1].Name != FileName(1, 60) {
		t.Fatalf("results %+v", results)
	}
	if infos, _ := d.List(); len(infos) != 1 || infos[0].Iter != 60 {
		t.Fatalf("with keep 1 the directory holds %v", infos)
	}
}
