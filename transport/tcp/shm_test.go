package tcp

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/gyre-ml/gyre/transport"
	"github.com/gyre-ml/gyre/transport/transporttest"
)

// TestSharedMemoryRouting: two nodes with the path on reach each other
// through it; a node with it off is reached over TCP by both, and reaches
// them so, and every message arrives either way.
func TestSharedMemoryRouting(t *testing.T) {
	ca := transporttest.NewCA(t)
	on := func(c *Config) { c.SharedMemory = true }
	a, b := newNode(t, ca, "a", on), newNode(t, ca, "b", on)
	c := newNode(t, ca, "c", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, p := range [][2]*Transport{{a, b}, {b, a}, {a, c}, {c, a}, {c, b}} {
		exchange(t, ctx, p[0], p[1], p[0].cfg.ID, p[1].cfg.ID, 3, 3<<20+7)
	}
	if !a.SharedMemory("b") || !b.SharedMemory("a") {
		t.Error("a and b, both with the path, do not reach each other through it")
	}
	if a.SharedMemory("c") || c.SharedMemory("a") || c.SharedMemory("b") {
		t.Error("a link to or from c, which has the path off, claims shared memory")
	}
	if opened, accepted := a.shm.Streams(); opened != 1 || accepted != 1 {
		t.Errorf("a opened %d and accepted %d shared-memory streams, want 1 and 1 (with b)", opened, accepted)
	}
	if c.shm != nil {
		t.Error("c, with the path off, listens for it")
	}
}

// TestSharedMemoryRefusesAnotherCluster: a local worker of another
// cluster finds this one's socket but cannot attach: Connect fails with
// ErrUnauthenticated, and the refusal names its process.
func TestSharedMemoryRefusesAnotherCluster(t *testing.T) {
	on := func(c *Config) { c.SharedMemory = true }
	a := newNode(t, transporttest.NewCA(t), "a", on)
	intruder := newNode(t, transporttest.NewCA(t), "intruder", on)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := intruder.Connect(ctx, "a", a.Addr())
	if !errors.Is(err, transport.ErrUnauthenticated) {
		t.Fatalf("Connect from another cluster: %v, want ErrUnauthenticated", err)
	}
	if _, accepted := a.shm.Streams(); accepted != 0 {
		t.Fatalf("a accepted %d streams from another cluster", accepted)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(a.Refusals()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	refs := a.Refusals()
	if len(refs) == 0 || !strings.HasPrefix(refs[0].Remote, "pid ") || !errors.Is(refs[0].Err, transport.ErrUnauthenticated) {
		t.Fatalf("a's refusals %+v: want one naming the intruder's process", refs)
	}
}

// TestSharedMemoryChurnLeavesNothing: 20 rounds of connecting, sending
// through shared memory and forgetting end with the goroutines there
// were before, and with no ring still mapped.
func TestSharedMemoryChurnLeavesNothing(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ca := transporttest.NewCA(t)
	on := func(c *Config) { c.SharedMemory = true }
	a, b := newNode(t, ca, "a", on), newNode(t, ca, "b", on)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 20 {
		exchange(t, ctx, a, b, "a", "b", 2, 64<<10)
		exchange(t, ctx, b, a, "b", "a", 2, 64<<10)
		if i == 0 && ringsMapped(t) < 4 { // each side's outbound ring, mapped by both
			t.Fatalf("%d rings mapped while a and b exchange; want 4 or more", ringsMapped(t))
		}
		a.Forget("b")
		b.Forget("a")
	}
	deadline := time.Now().Add(5 * time.Second)
	for ringsMapped(t) > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the cores close forgotten streams as their readers end
	}
	if n := ringsMapped(t); n > 0 {
		t.Errorf("%d rings still mapped after every peer was forgotten", n)
	}
	a.Close()
	b.Close()
}

// ringsMapped counts this process's mappings of shared-memory rings.
func ringsMapped(t *testing.T) int {
	maps, err := os.ReadFile("/proc/self/maps")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(maps), "memfd:gyre-ring")
}

// TestSharedMemoryOneStripe: a channel set to 4 stripes still uses one to
// a peer reached through shared memory, where striping a ring gains
// nothing, and 4 to a peer reached over TCP.
func TestSharedMemoryOneStripe(t *testing.T) {
	ca := transporttest.NewCA(t)
	on := func(c *Config) { c.SharedMemory = true }
	a, b := newNode(t, ca, "a", on), newNode(t, ca, "b", on)
	c := newNode(t, ca, "c", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := a.SetStripes(transport.ChanData, 4); err != nil {
		t.Fatal(err)
	}
	exchange(t, ctx, a, b, "a", "b", 2, 3<<20+7)
	exchange(t, ctx, a, c, "a", "c", 2, 3<<20+7)
	if !a.SharedMemory("b") {
		t.Fatal("a does not reach b through shared memory")
	}
	if opened, _ := a.shm.Streams(); opened != 1 {
		t.Errorf("a opened %d shared-memory streams to b, want 1", opened)
	}
	if n := a.core.LinkCount("b"); n != 1 {
		t.Errorf("a holds %d links to b, through shared memory; want 1", n)
	}
	if n := a.core.LinkCount("c"); n != 4 {
		t.Errorf("a holds %d links to c, over TCP; want 4", n)
	}
}
