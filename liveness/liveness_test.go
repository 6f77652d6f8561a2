package liveness_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/internal/wire"
	"github.com/gyre-ml/gyre/liveness"
	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/mem"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const interval = 20 * time.Millisecond

// pair returns two connected mem transports with a Monitor each, watching
// the other; progress, if given, is each Monitor's Config.Progress.
func pair(t *testing.T, progress ...func() liveness.Progress) (*mem.Network, [2]*mem.Transport, [2]*liveness.Monitor) {
	t.Helper()
	net := mem.NewNetwork(1)
	var trs [2]*mem.Transport
	var mons [2]*liveness.Monitor
	for i, id := range []transport.PeerID{"a", "b"} {
		tr, err := net.Join(id)
		if err != nil {
			t.Fatal(err)
		}
		trs[i] = tr
		t.Cleanup(func() { tr.Close() })
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	for i, peer := range []transport.PeerID{"b", "a"} {
		if err := trs[i].Connect(ctx, peer, string(peer)); err != nil {
			t.Fatal(err)
		}
		cfg := liveness.Config{Transport: trs[i], Interval: interval}
		if i < len(progress) {
			cfg.Progress = progress[i]
		}
		m, err := liveness.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		m.Watch([]transport.PeerID{peer})
		mons[i] = m
	}
	return net, trs, mons
}

// heardAfter waits up to 2 s for a heartbeat of peer's to reach m after t.
func heardAfter(m *liveness.Monitor, peer transport.PeerID, t time.Time) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(interval / 4) {
		if m.LastHeard(peer).After(t) {
			return true
		}
	}
	return false
}

// heardWithin waits up to 2 s for m to have heard peer within d.
func heardWithin(m *liveness.Monitor, peer transport.PeerID, d time.Duration) bool {
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(interval) {
		if time.Since(m.LastHeard(peer)) < d {
			return true
		}
	}
	return false
}

func TestHeartbeatsAndFreeze(t *testing.T) {
	net, _, mons := pair(t)
	start := time.Now()
	time.Sleep(10 * interval)
	if !mons[0].LastHeard("b").After(start) || !mons[1].LastHeard("a").After(start) {
		t.Fatalf("no heartbeat in %v: last heard %v and %v after start", 10*interval,
			mons[0].LastHeard("b").Sub(start), mons[1].LastHeard("a").Sub(start))
	}
	net.Freeze("b")
	time.Sleep(15 * interval)
	if silent := time.Since(mons[0].LastHeard("b")); silent < 10*interval {
		t.Fatalf("a frozen peer was heard %v ago", silent)
	}
	net.Thaw("b")
	if !heardWithin(mons[0], "b", 3*interval) {
		t.Fatal("no heartbeat after Thaw")
	}
}

// TestBusyIsNotSilent: data that nobody reads does not hold heartbeats
// back, since they travel on their own channel.
func TestBusyIsNotSilent(t *testing.T) {
	_, trs, mons := pair(t)
	payload := make([]byte, 1<<20)
	for i := range 64 {
		if err := trs[1].Send(t.Context(), "a", transport.ChanData, hdrSeq(i), payload); err != nil {
			t.Fatal(err)
		}
	}
	if !heardWithin(mons[0], "b", 3*interval) {
		t.Fatal("heartbeats queued behind unread data")
	}
}

func TestWatchAndClose(t *testing.T) {
	_, _, mons := pair(t)
	if got := mons[0].LastHeard("nobody"); !got.IsZero() {
		t.Fatalf("unwatched peer heard at %v", got)
	}
	mons[0].Watch(nil)
	if got := mons[0].LastHeard("b"); !got.IsZero() {
		t.Fatalf("peer no longer watched heard at %v", got)
	}
	mons[0].Close()
	mons[0].Close() // idempotent
	mons[0].Watch([]transport.PeerID{"b"})
	if got := mons[0].LastHeard("b"); !got.IsZero() {
		t.Fatal("Watch after Close started watching")
	}
}

func hdrSeq(i int) wire.Header { return wire.Header{Kind: wire.KindData, Seq: uint64(i)} }

// TestFarewell: Farewell returns once every peer has said farewell, or is
// gone, or silent past patience; a peer that is alive and says nothing
// holds it until its context ends.
func TestFarewell(t *testing.T) {
	t.Run("both", func(t *testing.T) {
		_, _, mons := pair(t)
		errs := make(chan error, 2)
		for _, m := range mons {
			go func() { errs <- m.Farewell(t.Context(), time.Minute) }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("peer closed", func(t *testing.T) {
		_, trs, mons := pair(t)
		time.AfterFunc(50*time.Millisecond, func() { trs[1].Close() })
		if err := mons[0].Farewell(t.Context(), time.Minute); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("peer frozen", func(t *testing.T) {
		net, _, mons := pair(t)
		net.Freeze("b")
		t.Cleanup(func() { net.Thaw("b") })
		start := time.Now()
		if err := mons[0].Farewell(t.Context(), 10*interval); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 5*interval {
			t.Fatalf("Farewell returned after %v, before the frozen peer was silent for long", d)
		}
	})
	t.Run("peer back after a break", func(t *testing.T) {
		// A link that broke and came back (a worker that rejoined, a
		// healed blip) is a live peer again: Farewell waits for it. It
		// once counted as gone for good, and a worker then closed while
		// that peer still waited for its last barrier message.
		_, trs, mons := pair(t)
		if !heardWithin(mons[0], "b", 3*interval) {
			t.Fatal("no heartbeat")
		}
		trs[0].Drop("b", errors.New("test: broken"))
		time.Sleep(2 * interval) // a's receive fails
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		for i, peer := range []transport.PeerID{"b", "a"} {
			if err := trs[i].Connect(ctx, peer, string(peer)); err != nil {
				t.Fatal(err)
			}
		}
		broke := time.Now()
		for deadline := time.Now().Add(2 * time.Second); mons[0].LastHeard("b").Before(broke); time.Sleep(interval / 4) {
			if time.Now().After(deadline) {
				t.Fatal("b not heard again after the link came back")
			}
		}
		fctx, fcancel := context.WithTimeout(t.Context(), 10*interval)
		defer fcancel()
		if err := mons[0].Farewell(fctx, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Farewell = %v, want it to wait for b, heard again, until the deadline", err)
		}
	})
	t.Run("peer silent but alive", func(t *testing.T) {
		_, _, mons := pair(t)
		ctx, cancel := context.WithTimeout(t.Context(), 10*interval)
		defer cancel()
		if err := mons[0].Farewell(ctx, time.Minute); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Farewell = %v, want it to wait for the live peer until the deadline", err)
		}
	})
}

// TestBroken: a peer whose connection is killed shows as broken, from
// about the moment it broke; a healthy one, or one that said farewell
// before closing, does not.
func TestBroken(t *testing.T) {
	net, _, mons := pair(t)
	if !heardAfter(mons[0], "b", time.Now()) {
		t.Fatal("no heartbeat")
	}
	if _, ok := mons[0].Broken("b"); ok {
		t.Fatal("a healthy peer is broken")
	}
	killed := time.Now()
	net.Kill("b")
	var at time.Time
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(interval / 4) {
		var ok bool
		if at, ok = mons[0].Broken("b"); ok {
			break
		}
	}
	if at.IsZero() || at.Before(killed) || at.Sub(killed) > time.Second {
		t.Fatalf("killed at %v, broken at %v", killed, at)
	}

	_, trs, mons := pair(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*interval)
	defer cancel()
	mons[1].Farewell(ctx, time.Minute) // says farewell; a's never comes, so it returns at ctx's end
	trs[1].Close()
	time.Sleep(5 * interval)
	if at, ok := mons[0].Broken("b"); ok {
		t.Fatalf("a peer that said farewell is broken at %v", at)
	}
}

// TestBrokenBeforeHeard: receives that fail before a newly watched peer
// is first heard (the end of streams an earlier incarnation left) do not
// make it broken; only its silence counts. Once heard, a break counts.
func TestBrokenBeforeHeard(t *testing.T) {
	net, _, mons := pair(t)
	if !heardWithin(mons[0], "b", 3*interval) {
		t.Fatal("no heartbeat")
	}
	mons[0].Watch(nil)
	net.Kill("b")
	watched := time.Now()
	mons[0].Watch([]transport.PeerID{"b"})
	time.Sleep(10 * interval) // several failed receives
	if at, ok := mons[0].Broken("b"); ok {
		t.Fatalf("a peer never heard since it was watched is broken at %v", at)
	}
	if heard := mons[0].LastHeard("b"); heard.Before(watched.Add(-interval)) || heard.After(time.Now()) {
		t.Fatalf("last heard %v; want the watch's start, %v", heard, watched)
	}

	// b comes back, is heard, and is killed: now it breaks.
	b, err := net.Join("b")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := b.Connect(ctx, "a", "a"); err != nil {
		t.Fatal(err)
	}
	mb, err := liveness.New(liveness.Config{Transport: b, Interval: interval})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mb.Close() })
	mb.Watch([]transport.PeerID{"a"})
	if !heardAfter(mons[0], "b", time.Now()) {
		t.Fatal("no heartbeat from b's new incarnation")
	}
	net.Kill("b")
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(interval / 4) {
		if _, ok := mons[0].Broken("b"); ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a peer heard, then killed, is not broken")
		}
	}
}

// TestFirstHeartbeatOnConnect: a peer watched before its link is up gets
// its first heartbeat as soon as the link is, not an interval later, so
// that a crash early in a job shows as a broken connection.
func TestFirstHeartbeatOnConnect(t *testing.T) {
	const slow = 5 * time.Second // the interval: far longer than the test waits
	net := mem.NewNetwork(1)
	trs := map[transport.PeerID]*mem.Transport{}
	for _, id := range []transport.PeerID{"a", "b"} {
		tr, err := net.Join(id)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		trs[id] = tr
	}
	mons := map[transport.PeerID]*liveness.Monitor{}
	for _, id := range []transport.PeerID{"a", "b"} {
		m, err := liveness.New(liveness.Config{Transport: trs[id], Interval: slow})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		mons[id] = m
	}
	mons["a"].Watch([]transport.PeerID{"b"})
	mons["b"].Watch([]transport.PeerID{"a"}) // b is not connected to a yet: its first send fails
	time.Sleep(50 * time.Millisecond)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	connected := time.Now()
	if err := trs["b"].Connect(ctx, "a", "a"); err != nil {
		t.Fatal(err)
	}
	for !mons["a"].LastHeard("b").After(connected) {
		if time.Since(connected) > time.Second {
			t.Fatalf("no heartbeat from b within 1 s of its link coming up (interval %v)", slow)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestProgress checks that heartbeats carry each worker's progress, and
// that a worker reporting none is known to have sent none.
func TestProgress(t *testing.T) {
	var seq atomic.Uint64
	_, _, mons := pair(t, func() liveness.Progress { return liveness.Progress{Epoch: 3, Iter: 41, Begun: seq.Load(), Left: 2} })
	seq.Store(7)
	want := liveness.Progress{Epoch: 3, Iter: 41, Begun: 7, Left: 2}
	deadline := time.Now().Add(2 * time.Second)
	for {
		got, at, ok := mons[1].Progress("a")
		if ok && got == want && time.Since(at) < time.Second {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("b has a's progress %+v (%v), want %+v", got, ok, want)
		}
		time.Sleep(interval)
	}
	if got, _, ok := mons[0].Progress("b"); ok {
		t.Errorf("b sends no progress, yet a has %+v", got)
	}
	if _, _, ok := mons[1].Progress("nobody"); ok {
		t.Error("progress of a peer not watched")
	}
	behind, ahead := liveness.Progress{Epoch: 3, Iter: 41, Begun: 6}, liveness.Progress{Epoch: 4, Begun: 1}
	if !behind.Before(want) || want.Before(behind) || !want.Before(ahead) || want.Before(want) {
		t.Error("Before does not order by epoch, then collectives begun")
	}
}
