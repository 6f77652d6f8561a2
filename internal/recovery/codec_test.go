package recovery

import (
	"errors"
	"reflect"
	"testing"
)

func TestCodecRoundTrip(t *testing.T) {
	v := View{Epoch: 4, Members: ids("a", "b", "c"), Joiners: ids("c")}
	w := Winner{Holder: "b", Commit: Commit{Epoch: 3, Iter: 17, Digest: 1<<63 + 5}}
	rd := Round{N: 2, Coord: "a"}
	for _, m := range []Msg{
		Report{Round: rd, From: "b", Reach: ids("a"), Installed: v, Accepted: v, AcceptedRound: rd, AcceptedWinner: w, Commit: w.Commit},
		Propose{Round: rd, Ref: v, View: View{Epoch: 5, Members: ids("a", "b")}, Lost: ids("c"), Winner: w},
		Accept{Round: rd, Epoch: 5},
		Install{Round: rd, View: v, Winner: w},
	} {
		b, err := Encode(m)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Decode(b)
		if err != nil {
			t.Fatalf("%T: %v", m, err)
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%T: got %+v, want %+v", m, got, m)
		}
	}
}

func TestDecodeRefusesGarbage(t *testing.T) {
	for _, b := range []string{``, `{`, `{"v":2,"kind":"accept","msg":{}}`, `{"v":1,"kind":"vote","msg":{}}`,
		`{"v":1,"kind":"accept","msg":[1]}`, "\x00\x01garbage"} {
		if _, err := Decode([]byte(b)); !errors.Is(err, ErrBadMessage) {
			t.Errorf("Decode(%q) = %v, want ErrBadMessage", b, err)
		}
	}
}

func FuzzDecode(f *testing.F) {
	b, _ := Encode(Accept{Round: Round{N: 1, Coord: "a"}, Epoch: 2})
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrBadMessage) {
				t.Fatalf("error %v does not match ErrBadMessage", err)
			}
			return
		}
		if _, err := Encode(m); err != nil {
			t.Fatalf("decoded %+v does not encode: %v", m, err)
		}
	})
}
