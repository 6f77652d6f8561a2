package bench

import (
	"errors"
	"slices"
	"testing"
)

func TestParseSizes(t *testing.T) {
	tests := []struct {
		in   string
		want []int64
	}{
		{"4K,1M,64M", []int64{4 << 10, 1 << 20, 64 << 20}},
		{"4k, 1m ,2g", []int64{4 << 10, 1 << 20, 2 << 30}},
		{"1", []int64{1}},
		{"1000,4096", []int64{1000, 4096}},
		{"256M", []int64{256 << 20}},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseSizes(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, tt.want) {
				t.Fatalf("ParseSizes(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseSizesRejects(t *testing.T) {
	for _, in := range []string{
		"", " ", ",", "4K,", ",4K", "K", "4KB", "4T", "0", "0K", "-4K", "+4K",
		"4.5M", "1e6", "abc", "4 K", "9999999999999G", "0x10",
	} {
		t.Run(in, func(t *testing.T) {
			got, err := ParseSizes(in)
			if err == nil {
				t.Fatalf("ParseSizes(%q) = %v, want an error", in, got)
			}
			if !errors.Is(err, ErrBadList) {
				t.Fatalf("error %v does not wrap ErrBadList", err)
			}
		})
	}
}

func TestParseInts(t *testing.T) {
	got, err := ParseInts("1, 2,4", 1, 16)
	if err != nil || !slices.Equal(got, []int{1, 2, 4}) {
		t.Fatalf("ParseInts = %v, %v", got, err)
	}
	for _, in := range []string{"", "0", "17", "1,,2", "two", "1.5"} {
		if got, err := ParseInts(in, 1, 16); !errors.Is(err, ErrBadList) {
			t.Errorf("ParseInts(%q) = %v, %v; want ErrBadList", in, got, err)
		}
	}
}

func TestFormatSizeRoundTrip(t *testing.T) {
	for _, n := range []int64{1, 1000, 4 << 10, 1<<20 + 1, 64 << 20, 3 << 30, 1536} {
		s := FormatSize(n)
		got, err := ParseSizes(s)
		if err != nil || got[0] != n {
			t.Errorf("FormatSize(%d) = %q, which parses to %v, %v", n, s, got, err)
		}
	}
	if got := FormatSize(64 << 20); got != "64M" {
		t.Errorf("FormatSize(64M) = %q", got)
	}
}

func TestDefaultIters(t *testing.T) {
	for size, want := range map[int64]int{4 << 10: 20, 16<<20 - 1: 20, 16 << 20: 10, 256 << 20: 10} {
		if got := DefaultIters(size); got != want {
			t.Errorf("DefaultIters(%d) = %d, want %d", size, got, want)
		}
	}
}

func TestMedian(t *testing.T) {
	tests := []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
		{[]float64{5, 5, 1, 9, 7}, 5},
	}
	for _, tt := range tests {
		in := slices.Clone(tt.in)
		if got := Median(tt.in); got != tt.want {
			t.Errorf("Median(%v) = %v, want %v", tt.in, got, tt.want)
		}
		if !slices.Equal(in, tt.in) {
			t.Errorf("Median modified its input: %v", tt.in)
		}
	}
}
