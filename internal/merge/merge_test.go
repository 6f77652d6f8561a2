package merge

import "testing"

// TestJudge: a view yields to the highest-ranked view it sees if that one
// ranks above its own published rank: a higher iteration, or the same
// and a smaller lead.
func TestJudge(t *testing.T) {
	own := Own{Lead: "10.0.0.5:7000", Published: 100}
	for _, tc := range []struct {
		name string
		seen []Sight
		to   string // "" stays
	}{
		{"alone", nil, ""},
		{"behind it", []Sight{{Lead: "10.0.0.1:7000", Commit: 99}}, ""},
		{"ahead of it", []Sight{{Lead: "10.0.0.9:7000", Commit: 101}}, "10.0.0.9:7000"},
		{"a tie, smaller lead", []Sight{{Lead: "10.0.0.1:7000", Commit: 100}}, "10.0.0.1:7000"},
		{"a tie, larger lead", []Sight{{Lead: "10.0.0.9:7000", Commit: 100}}, ""},
		{"the highest of several", []Sight{{Lead: "10.0.0.7:7000", Commit: 150}, {Lead: "10.0.0.9:7000", Commit: 180},
			{Lead: "10.0.0.2:7000", Commit: 180}, {Lead: "10.0.0.1:7000", Commit: 50}}, "10.0.0.2:7000"},
		{"its own lead, seen under an old picture", []Sight{{Lead: own.Lead, Commit: 500}}, ""},
	} {
		v := Judge(own, tc.seen)
		switch {
		case tc.to == "" && v.Yield:
			t.Errorf("%s: yields to %x; want to stay", tc.name, v.To)
		case tc.to != "" && (!v.Yield || v.To != LeadHash(tc.to)):
			t.Errorf("%s: %+v; want to yield to %s", tc.name, v, tc.to)
		}
	}
}

// TestAgree: the view acts on its lowest rank's yield.
func TestAgree(t *testing.T) {
	a, b := Verdict{Yield: true, To: 1, Commit: 5}, Verdict{Yield: true, To: 2, Commit: 9}
	if got := Agree([]Verdict{{}, a, b}); got != a {
		t.Errorf("Agree = %+v; want rank 1's %+v", got, a)
	}
	if got := Agree([]Verdict{{}, {}}); got.Yield {
		t.Errorf("no member yields, yet Agree = %+v", got)
	}
}

// TestLeadHash: never 0, which marks none, and distinct for distinct leads.
func TestLeadHash(t *testing.T) {
	if LeadHash("") == 0 || LeadHash("a") == LeadHash("b") {
		t.Error("LeadHash is 0, or names two leads alike")
	}
}
