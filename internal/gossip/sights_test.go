package gossip

import (
	"slices"
	"testing"

	"github.com/gyre-ml/gyre/internal/admission"
	"github.com/gyre-ml/gyre/internal/merge"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/transport"
)

// TestSights: the started views outside this worker's, by lead, each at
// the highest iteration a member publishes; pending workers, workers not
// started, ones that name no lead, this worker and its view's members are
// left out.
func TestSights(t *testing.T) {
	w := func(id string, epoch uint64, started bool, lead string, commit int64) admission.Worker {
		return admission.Worker{Member: vote.Member{ID: transport.PeerID(id)}, Epoch: epoch, Started: started, Lead: lead, Commit: commit}
	}
	ws := []admission.Worker{
		w("self", 4, true, "a", 100),
		w("mate", 4, true, "a", 100),
		w("b1", 7, true, "b", 300),
		w("b2", 7, true, "b", 320), // published later
		w("c1", 2, true, "c", 50),
		w("pending", 0, true, "", 0),
		w("assembling", 1, false, "d", 0),
		w("old", 3, true, "", 9), // an earlier version names no lead
	}
	got := sights(ws, "self", func(id transport.PeerID) bool { return id == "mate" })
	want := []merge.Sight{{Lead: "b", Commit: 320}, {Lead: "c", Commit: 50}}
	if !slices.Equal(got, want) {
		t.Errorf("sights %+v; want %+v", got, want)
	}
}
