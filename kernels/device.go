package kernels

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Kind is the kind of a compute device.
type Kind uint8

// Device kinds. Only KindCPU is probed today; KindGPU arrives with the NVML
// probe (build tag cgo && linux), which will report one Device per GPU.
const (
	KindCPU Kind = iota + 1
	KindGPU
)

func (k Kind) String() string {
	switch k {
	case KindCPU:
		return "cpu"
	case KindGPU:
		return "gpu"
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Device describes one compute device, as a plain value that membership
// can carry in node metadata and balance can read. Fields a probe cannot
// learn are left zero ("unknown" for Name), never guessed.
type Device struct {
	Kind  Kind
	Index int    // position among devices of the same Kind; 0 for the host CPU
	Name  string // model name, e.g. "Intel(R) Xeon(R) Processor"; "unknown" if unreadable
	Cores int    // logical CPUs usable by this process (runtime.NumCPU); for a GPU, its multiprocessors

	// MemoryBytes is the device's total memory: for the CPU, the host's
	// RAM (MemTotal in /proc/meminfo); 0 if unknown.
	MemoryBytes uint64
	// FreeBytes is memory not in use at probe time (MemAvailable for the
	// CPU); 0 if unknown. It becomes the balance model's headroom.
	FreeBytes uint64
	// Utilization is the busy fraction in [0, 1] at probe time, for GPUs
	// through NVML; always 0 for the CPU.
	Utilization float64
}

func (d Device) String() string {
	return fmt.Sprintf("%s%d %q cores=%d mem=%d free=%d", d.Kind, d.Index, d.Name, d.Cores, d.MemoryBytes, d.FreeBytes)
}

// Probe reports the host CPU. It never fails: on systems without /proc
// (anything but Linux, or a sandbox that hides it) Name is "unknown" and
// the memory fields are 0.
func Probe() Device {
	d := Device{Kind: KindCPU, Name: "unknown", Cores: runtime.NumCPU()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		if name := cpuModel(b); name != "" {
			d.Name = name
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		d.MemoryBytes, d.FreeBytes = memInfo(b)
	}
	return d
}

// cpuModel returns the processor name from /proc/cpuinfo text, or "". x86
// calls it "model name"; other architectures use the other keys, in this
// order of preference.
func cpuModel(cpuinfo []byte) string {
	keys := []string{"model name", "Hardware", "Processor", "cpu model", "cpu"}
	found := make(map[string]string, len(keys))
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if _, seen := found[k]; !seen && v != "" {
			found[k] = v
		}
	}
	for _, k := range keys {
		if v := found[k]; v != "" {
			return v
		}
	}
	return ""
}

// memInfo returns MemTotal and MemAvailable in bytes from /proc/meminfo
// text, each 0 if absent.
func memInfo(meminfo []byte) (total, avail uint64) {
	sc := bufio.NewScanner(bytes.NewReader(meminfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		if len(f) > 1 && f[1] == "kB" {
			n *= 1024
		}
		switch k {
		case "MemTotal":
			total = n
		case "MemAvailable":
			avail = n
		}
	}
	return total, avail
}
