package gossip

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gyre-ml/gyre/internal/admission"
	"github.com/gyre-ml/gyre/internal/errs"
	"github.com/gyre-ml/gyre/internal/vote"
	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/transport"
)

// WelcomeVersion is the welcome's encoding version.
const WelcomeVersion = 1

// Welcome is what the members send a joiner they admitted: the view it
// enters and where the job is.
type Welcome struct {
	Version int
	Epoch   uint64
	// Iter is the iteration the view runs next.
	Iter    int64
	Members []vote.Member
	Shares  []int
	// Old are the ranks of the members of the previous view, each of
	// which sends a welcome; the first is the state broadcast's root.
	Old []int
	// Prestart says admission rounds go on before iteration 0.
	Prestart bool
	// Lead is the view's lead in the merge of started views
	// (internal/merge): the joiner's view takes it.
	Lead string `json:",omitempty"`
}

// welcomeFlag marks a welcome in the header's Flags, apart from the ring's
// control messages.
const welcomeFlag = 0x80

// SendWelcome sends joiner j the welcome wel on the control channel,
// within ctx; the caller has dialled it.
func SendWelcome(ctx context.Context, t transport.Transport, j transport.PeerID, wel Welcome) error {
	b, err := json.Marshal(wel)
	if err != nil {
		return err
	}
	hdr := wire.Header{Kind: wire.KindControl, Flags: welcomeFlag, Epoch: wel.Epoch}
	return t.Send(ctx, j, transport.ChanControl, hdr, b)
}

// maxWelcome bounds a welcome's JSON: MaxView members of about 100 bytes
// each, and their shares, fit with room to spare. A joiner listens to
// every member at once, so each buffer counts.
const maxWelcome = 64 << 10

// recvWelcome reads one welcome from peer on the control channel.
func recvWelcome(ctx context.Context, t transport.Transport, peer transport.PeerID) (Welcome, error) {
	buf := make([]byte, maxWelcome)
	h, n, err := t.Recv(ctx, peer, transport.ChanControl, buf)
	if err != nil {
		return Welcome{}, err
	}
	if h.Kind != wire.KindControl || h.Flags != welcomeFlag {
		return Welcome{}, fmt.Errorf("gyre: %s sent a %v message where its welcome was due", peer, h.Kind)
	}
	var wel Welcome
	if err := json.Unmarshal(buf[:n], &wel); err != nil {
		return Welcome{}, fmt.Errorf("gyre: welcome from %s: %w", peer, err)
	}
	if wel.Version != WelcomeVersion {
		return Welcome{}, fmt.Errorf("gyre: welcome from %s has version %d, this worker reads %d", peer, wel.Version, WelcomeVersion)
	}
	return wel, nil
}

// AwaitWelcome waits, pending, until the members admit this worker, and
// returns the welcome. Meanwhile it runs the admission handshake with
// every member gossip lists (handshakes), and fails if one refuses this
// worker. It listens to every worker gossip lists in a view;
// once one welcome arrives it reads the others' too, so that the control
// channels are past them before the new view's votes, and checks that
// they agree. With startIfGone (the starter, at Join) it returns
// errJobGone once gossip has listed no worker of the job in a view for
// jobGoneGrace. ended says why ctx ended, for errors.
func (g *Gossip) AwaitWelcome(ctx context.Context, t transport.Transport, req admission.Request, startIfGone bool,
	note time.Duration, ended func(context.Context) error) (Welcome, error) {
	type result struct {
		from transport.PeerID
		wel  Welcome
		err  error
	}
	results := make(chan result)
	listening := map[transport.PeerID]context.CancelFunc{}
	got := map[transport.PeerID]Welcome{}
	listen := func(id transport.PeerID) {
		lctx, cancel := context.WithCancel(ctx)
		listening[id] = cancel
		go func() {
			wel, err := recvWelcome(lctx, t, id)
			results <- result{id, wel, err}
		}()
	}
	collect := func(r result) error {
		listening[r.from]()
		delete(listening, r.from)
		if r.err == nil {
			got[r.from] = r.wel
			return nil
		}
		if ctx.Err() != nil || errors.Is(r.err, context.Canceled) {
			return nil //nolint:nilerr // a listener stopped on purpose: not a failure to report
		}
		return r.err
	}
	defer func() { // stop the listeners left, and wait for them
		for _, cancel := range listening {
			cancel()
		}
		for range listening {
			<-results
		}
	}()
	hs := admission.StartHandshakes(t, req, g.log.With().Str("component", "admission").Logger())
	defer hs.Close() // idempotent; the first welcome ends the handshakes already
	tick := time.NewTicker(admission.Poll)
	defer tick.Stop()
	var first Welcome
	since, noted, lastRunning := time.Now(), time.Now(), time.Now()
	for len(got) == 0 {
		_, _, inView := g.Members(func(transport.PeerID) bool { return false })
		hs.Retain(inView)
		if err := hs.Refused(); err != nil {
			return Welcome{}, err
		}
		if startIfGone {
			if g.RunningJob() {
				lastRunning = time.Now()
			} else if time.Since(lastRunning) >= jobGoneGrace {
				return Welcome{}, ErrJobGone
			}
		}
		if time.Since(noted) >= note {
			noted = time.Now()
			hs.Note(time.Since(since), g.ProtocolMismatch())
			if e := g.log.Debug(); e.Enabled() {
				var seen []string
				for _, m := range g.Workers() {
					seen = append(seen, fmt.Sprintf("%s@%d", m.ID, m.Epoch))
				}
				e.Strs("workers", seen).Msg("pending: the job's workers in gossip, with their epochs (0: pending)")
			}
		}
		for _, m := range inView {
			if listening[m.ID] == nil {
				listen(m.ID)
			}
		}
		select {
		case r := <-results:
			if err := collect(r); err != nil {
				g.log.Debug().Err(err).Str("peer", string(r.from)).Msg("listening for a welcome")
			}
		case <-tick.C:
		case <-ctx.Done():
			msg, _, _, _ := hs.Status()
			if len(inView) == 0 {
				msg += g.ProtocolMismatch()
			}
			return Welcome{}, fmt.Errorf("gyre: no boundary admitted this worker; %s: %w", msg, ended(ctx))
		}
	}
	hs.Close() // admitted: nothing more to say on the join channel
	for _, wel := range got {
		first = wel
	}
	need := map[transport.PeerID]bool{}
	for _, r := range first.Old {
		if r >= 0 && r < len(first.Members) {
			need[first.Members[r].ID] = true
		}
	}
	for id, cancel := range listening {
		if !need[id] {
			cancel() // not a member of the old view: it sends no welcome
		}
	}
	for len(listening) > 0 {
		if err := collect(<-results); err != nil {
			return Welcome{}, err
		}
	}
	for id := range need {
		if _, ok := got[id]; ok {
			continue
		}
		wel, err := recvWelcome(ctx, t, id)
		if err != nil {
			return Welcome{}, fmt.Errorf("gyre: waiting for the welcome of %s: %w", id, err)
		}
		got[id] = wel
	}
	for id, wel := range got {
		if !need[id] || wel.Epoch != first.Epoch || !slices.Equal(wel.Members, first.Members) || wel.Iter != first.Iter {
			return Welcome{}, fmt.Errorf("%w: the welcomes of the members disagree (%s sent epoch %d)", errs.Diverged, id, wel.Epoch)
		}
	}
	return first, nil
}
