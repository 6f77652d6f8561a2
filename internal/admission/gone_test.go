package admission

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/transport"
)

// deadGossip lists live workers and declares every other one dead.
type deadGossip struct{ live []Worker }

func (g deadGossip) Workers() []Worker { return g.live }
func (g deadGossip) Dead(id transport.PeerID) (string, bool) {
	for _, w := range g.live {
		if w.ID == id {
			return "", false
		}
	}
	return "gossip-of-" + string(id), true
}

// TestGoneJoinerOnceAdmitted: a pending joiner that gossip declares dead
// is blamed on its address only if no view held it; one admitted before,
// and pending again, was lost, and is forgotten as a former member.
func TestGoneJoinerOnceAdmitted(t *testing.T) {
	var buf bytes.Buffer
	member := vote.Member{ID: "m", Addr: "m:1"}
	a := &Admissions{g: deadGossip{live: []Worker{{Member: member, Epoch: 3}}}, log: zerolog.New(&buf),
		members: map[transport.PeerID]bool{}, former: map[transport.PeerID]bool{},
		links: map[transport.PeerID]*joinerHandshake{}, ending: map[transport.PeerID]*joinerHandshake{}}
	a.SetView([]vote.Member{member, {ID: "once", Addr: "once:1"}}) // a view held it
	a.SetView([]vote.Member{member})                               // and lost it
	for _, id := range []transport.PeerID{"once", "never"} {
		a.links[id] = &joinerHandshake{link: joinerLink{addr: string(id) + ":1"}, cancel: func() {}, done: make(chan struct{})}
	}
	a.poll(time.Now())
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		for _, id := range []string{"once", "never"} {
			if strings.Contains(l, `"joiner":"`+id+`"`) {
				lines[id] = l
			}
		}
	}
	if l := lines["once"]; !strings.Contains(l, "was lost") || strings.Contains(l, "before it was admitted") {
		t.Errorf("a joiner a view held once, then dead: %q", l)
	}
	if l := lines["never"]; !strings.Contains(l, "before it was admitted") || !strings.Contains(l, "--advertise") {
		t.Errorf("a joiner never admitted, then dead: %q", l)
	}
	if a.former["once"] {
		t.Error("a former member gone from gossip is still remembered")
	}
	if !a.former["m"] {
		t.Error("a member of the view is not remembered as one")
	}
}
