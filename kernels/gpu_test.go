package kernels

import (
	"errors"
	"testing"
)

// fakeNVML is a gpuLib with canned devices.
type fakeNVML struct {
	initErr  error
	devs     []Device
	bad      map[int]bool
	shutdown bool
}

func (f *fakeNVML) Init() error         { return f.initErr }
func (f *fakeNVML) Shutdown()           { f.shutdown = true }
func (f *fakeNVML) Count() (int, error) { return len(f.devs), nil }
func (f *fakeNVML) Device(i int) (Device, error) {
	if f.bad[i] {
		return Device{}, errors.New("GPU is lost")
	}
	return f.devs[i], nil
}

// TestProbeGPUsWithFake: the probe lists each GPU NVML describes, with
// its memory (the balance model's headroom) and utilisation, skips one it
// cannot describe, shuts NVML down, and returns nothing when NVML does
// not start.
func TestProbeGPUsWithFake(t *testing.T) {
	f := &fakeNVML{devs: []Device{
		{Name: "NVIDIA A100-SXM4-40GB", Cores: 6912, MemoryBytes: 40 << 30, FreeBytes: 39 << 30, Utilization: 0.25},
		{},
		{Name: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30, FreeBytes: 1 << 30},
	}, bad: map[int]bool{1: true}}
	got := probeGPUs(f)
	if len(got) != 2 || !f.shutdown {
		t.Fatalf("got %+v (shutdown %v), want GPUs 0 and 2", got, f.shutdown)
	}
	for i, want := range []struct {
		index int
		free  uint64
	}{{0, 39 << 30}, {2, 1 << 30}} {
		d := got[i]
		if d.Kind != KindGPU || d.Index != want.index || d.FreeBytes != want.free || d.MemoryBytes != 40<<30 || d.Name == "" {
			t.Fatalf("device %d: %+v", i, d)
		}
	}
	if got[0].Utilization != 0.25 || got[0].String() == "" {
		t.Fatalf("device 0: %+v", got[0])
	}
	if got := probeGPUs(&fakeNVML{initErr: errors.New("library not found")}); got != nil {
		t.Fatalf("NVML that does not start gave %+v", got)
	}
}

// TestGPUsFallBack: on this machine (no GPU, no NVML library, or a build
// without cgo) GPUs returns none and Devices only the CPU, with no error
// and no panic. On a GPU host the real NVML path is exercised instead.
func TestGPUsFallBack(t *testing.T) {
	gpus := GPUs()
	if len(gpus) > 0 {
		for _, d := range gpus {
			if d.Kind != KindGPU || d.MemoryBytes == 0 {
				t.Errorf("GPU %+v", d)
			}
		}
		return
	}
	if ds := Devices(); len(ds) != 1 || ds[0].Kind != KindCPU {
		t.Fatalf("Devices on a host without GPUs: %+v", ds)
	}
	t.Skip("no NVIDIA GPU or NVML library here: the CPU-only fallback was checked; the NVML path itself runs only on a GPU host")
}
