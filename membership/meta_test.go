package membership

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestMetaRoundTrip(t *testing.T) {
	m := Meta{DataAddr: "127.0.0.1:7947", Job: "train", Protocol: 1, Role: RoleWorker, Epoch: 9, Rank: -1, Device: "cpu:2", Started: true,
		Lead: "127.0.0.1:7001", Commit: 12345,
		Status: Status{Share: 66, Global: 256, Rate: 5300.5, JobRate: 21000, Loss: 0.25, HasLoss: true}}
	b, err := m.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Meta
	if err := got.UnmarshalBinary(b); err != nil || got != m {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, m)
	}
	// Earlier encodings still read: without the status, without the lead
	// and commit too, and without the flags byte too, as not started.
	withLead := len(b) - statusSize
	older := m
	older.Status = Status{}
	if err := got.UnmarshalBinary(b[:withLead]); err != nil || got != older {
		t.Fatalf("without the status: %+v, %v; want %+v", got, err, older)
	}
	withFlags := withLead - 9 - len(m.Lead)
	older.Lead, older.Commit = "", 0
	if err := got.UnmarshalBinary(b[:withFlags]); err != nil || got != older {
		t.Fatalf("without the lead: %+v, %v; want %+v", got, err, older)
	}
	older.Started = false
	if err := got.UnmarshalBinary(b[:withFlags-1]); err != nil || got != older {
		t.Fatalf("without the flags: %+v, %v; want %+v", got, err, older)
	}
	for n := range len(b) {
		if n == withLead || n == withFlags || n == withFlags-1 {
			continue
		}
		if err := got.UnmarshalBinary(b[:n]); !errors.Is(err, ErrMeta) {
			t.Fatalf("%d of %d bytes decoded: %v", n, len(b), err)
		}
	}
	if err := got.UnmarshalBinary(append(b, 7, 7)); err != nil || got != m {
		t.Fatalf("a later version's fields after the status: %+v, %v; want them skipped", got, err)
	}
	b[0] = 2
	if err := got.UnmarshalBinary(b); !errors.Is(err, ErrMeta) || !strings.Contains(err.Error(), "version 2") {
		t.Fatalf("unknown version: %v", err)
	}
}

func TestMetaLimits(t *testing.T) {
	if _, err := (Meta{Job: strings.Repeat("j", 256)}).MarshalBinary(); !errors.Is(err, ErrMeta) {
		t.Fatalf("a 256-byte field: %v", err)
	}
	big := Meta{DataAddr: strings.Repeat("a", 255), Job: strings.Repeat("j", 255), Device: strings.Repeat("d", 255)}
	if _, err := big.MarshalBinary(); !errors.Is(err, ErrMeta) {
		t.Fatalf("metadata over %d bytes: %v", MaxMeta, err)
	}
	// A status that would not fit is left out; the rest stays.
	full := Meta{DataAddr: strings.Repeat("a", 200), Job: strings.Repeat("j", 200), Lead: strings.Repeat("l", 80),
		Status: Status{Share: 1, Global: 2}}
	b, err := full.MarshalBinary()
	var got Meta
	if err != nil || got.UnmarshalBinary(b) != nil || got.Status != (Status{}) || got.Lead != full.Lead {
		t.Fatalf("a status past %d bytes: %v, decoded %+v", MaxMeta, err, got)
	}
}

func FuzzMeta(f *testing.F) {
	b, _ := Meta{DataAddr: "127.0.0.1:1", Job: "j", Role: RoleObserver}.MarshalBinary()
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		var m Meta
		if m.UnmarshalBinary(b) != nil {
			return
		}
		again, err := m.MarshalBinary()
		if err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
		// Compared as encodings: a status's float may be a NaN, which no
		// struct comparison finds equal to itself.
		var m2 Meta
		err = m2.UnmarshalBinary(again)
		third, _ := m2.MarshalBinary()
		if err != nil || !bytes.Equal(third, again) {
			t.Fatalf("re-encoding changed %+v to %+v (%v)", m, m2, err)
		}
	})
}
