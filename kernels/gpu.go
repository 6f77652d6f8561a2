package kernels

import "fmt"

// gpuLib is the part of NVML the GPU probe uses, so that tests can give a
// fake. Errors are NVML's, as Go errors.
type gpuLib interface {
	Init() error
	Shutdown()
	Count() (int, error)
	// Device describes GPU i: name, multiprocessors if known, memory
	// total and free, utilisation.
	Device(i int) (Device, error)
}

// nvmlProbe is the real library, set by gpu_nvml.go when Gyre is built with
// cgo on Linux; nil otherwise.
var nvmlProbe gpuLib

// GPUs reports the NVIDIA GPUs through NVML, one Device each (Kind
// KindGPU, Index its NVML index). It never fails: built without cgo, on a
// machine without the NVML library or without a GPU, it returns none.
func GPUs() []Device {
	if nvmlProbe == nil {
		return nil
	}
	return probeGPUs(nvmlProbe)
}

// Devices is the host CPU (Probe) followed by its GPUs.
func Devices() []Device { return append([]Device{Probe()}, GPUs()...) }

// probeGPUs lists lib's GPUs, skipping any it cannot describe.
func probeGPUs(lib gpuLib) []Device {
	if err := lib.Init(); err != nil {
		return nil // no library, no driver: a CPU-only host
	}
	defer lib.Shutdown()
	n, err := lib.Count()
	if err != nil {
		return nil
	}
	var out []Device
	for i := range n {
		d, err := lib.Device(i)
		if err != nil {
			continue
		}
		d.Kind, d.Index = KindGPU, i
		if d.Name == "" {
			d.Name = "unknown"
		}
		out = append(out, d)
	}
	return out
}

// nvmlError turns an NVML status into an error naming the call.
type nvmlError struct {
	call   string
	status fmt.Stringer
}

func (e nvmlError) Error() string { return fmt.Sprintf("kernels: NVML %s: %v", e.call, e.status) }
