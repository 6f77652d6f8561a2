//go:build cgo && linux

package kernels

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvmlLib is gpuLib over github.com/NVIDIA/go-nvml, which opens
// libnvidia-ml.so.1 at Init: a host without it fails Init, no more.
type nvmlLib struct{}

func init() { nvmlProbe = nvmlLib{} }

func check(call string, r nvml.Return) error {
	if r == nvml.SUCCESS {
		return nil
	}
	return nvmlError{call: call, status: r}
}

func (nvmlLib) Init() error { return check("Init", nvml.Init()) }
func (nvmlLib) Shutdown()   { _ = nvml.Shutdown() } // at exit: nothing to do if it fails

func (nvmlLib) Count() (int, error) {
	n, r := nvml.DeviceGetCount()
	return n, check("DeviceGetCount", r)
}

func (nvmlLib) Device(i int) (Device, error) {
	h, r := nvml.DeviceGetHandleByIndex(i)
	if err := check("DeviceGetHandleByIndex", r); err != nil {
		return Device{}, err
	}
	var d Device
	if name, r := h.GetName(); r == nvml.SUCCESS {
		d.Name = name
	}
	if mem, r := h.GetMemoryInfo(); r == nvml.SUCCESS {
		d.MemoryBytes, d.FreeBytes = mem.Total, mem.Free
	}
	if u, r := h.GetUtilizationRates(); r == nvml.SUCCESS {
		d.Utilization = float64(u.Gpu) / 100
	}
	if n, r := h.GetNumGpuCores(); r == nvml.SUCCESS {
		d.Cores = n
	}
	return d, nil
}
