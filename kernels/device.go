package kernels

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// Kind is the kind of a compute device.
type Kind uint8

// Device kinds: Probe reports the host CPU, GPUs the NVIDIA GPUs through
// NVML (built with cgo on Linux; none otherwise).
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
	Cores int    // logical CPUs usable by this process (runtime.NumCPU); for a GPU, its CUDA cores

	// MemoryBytes is the device's total memory: for the CPU, the host's
	// RAM (MemTotal in /proc/meminfo); 0 if unknown.
	MemoryBytes uint64
	// FreeBytes is memory not in use at probe time (MemAvailable for the
	// CPU); 0 if unknown. It becomes the balance model's headroom.
	FreeBytes uint64
	// Utilization is the busy fraction in [0, 1] at probe time, for GPUs
	// through NVML; always 0 for the CPU.
	Utilization float64
	// CPUQuota is how many cores this process's cgroup lets it use (its
	// CFS quota over period, the tightest along the cgroup's path, v1 or
	// v2); 0 if there is no quota or it cannot be read.
	CPUQuota float64
	// Load is the host's 1-minute load average; 0 if unknown.
	Load float64
	// Online is the number of CPUs online on the host (the cpuN lines of
	// /proc/stat), however few of them this process may use; 0 if
	// unknown. Processes that share the host share these.
	Online int
	// Boot is the running kernel's boot id (/proc/sys/kernel/random/boot_id),
	// "" if unknown. Processes with the same one share a machine's CPUs,
	// whatever their network addresses: containers and network namespaces
	// do not change it.
	Boot string
}

// Usable is the number of cores this process can use: Cores, capped by
// CPUQuota when there is one.
func (d Device) Usable() float64 {
	if d.CPUQuota > 0 && d.CPUQuota < float64(d.Cores) {
		return d.CPUQuota
	}
	return float64(d.Cores)
}

func (d Device) String() string {
	s := fmt.Sprintf("%s%d %q cores=%d mem=%d free=%d", d.Kind, d.Index, d.Name, d.Cores, d.MemoryBytes, d.FreeBytes)
	if d.CPUQuota > 0 {
		s += fmt.Sprintf(" quota=%.2f", d.CPUQuota)
	}
	return s
}

// Roots are the directories Probe reads the kernel's files from; tests
// point them at fake trees.
type Roots struct {
	Proc   string // default /proc
	Cgroup string // the cgroup mount; default /sys/fs/cgroup
}

// DefaultRoots are the real ones.
var DefaultRoots = Roots{Proc: "/proc", Cgroup: "/sys/fs/cgroup"}

// Probe reports the host CPU. It never fails: on systems without /proc
// (anything but Linux, or a sandbox that hides it) Name is "unknown" and
// the memory fields are 0.
func Probe() Device { return ProbeRoots(DefaultRoots) }

// ProbeRoots is Probe reading from roots.
func ProbeRoots(roots Roots) Device {
	d := Device{Kind: KindCPU, Name: "unknown", Cores: runtime.NumCPU()}
	if b, err := os.ReadFile(filepath.Join(roots.Proc, "cpuinfo")); err == nil {
		if name := cpuModel(b); name != "" {
			d.Name = name
		}
	}
	if b, err := os.ReadFile(filepath.Join(roots.Proc, "meminfo")); err == nil {
		d.MemoryBytes, d.FreeBytes = memInfo(b)
	}
	if b, err := os.ReadFile(filepath.Join(roots.Proc, "stat")); err == nil {
		d.Online = onlineCPUs(b)
	}
	if b, err := os.ReadFile(filepath.Join(roots.Proc, "sys", "kernel", "random", "boot_id")); err == nil {
		d.Boot = strings.TrimSpace(string(b))
	}
	if b, err := os.ReadFile(filepath.Join(roots.Proc, "loadavg")); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			d.Load, _ = strconv.ParseFloat(f[0], 64)
		}
	}
	if b, err := os.ReadFile(filepath.Join(roots.Proc, "self", "cgroup")); err == nil {
		d.CPUQuota = cpuQuota(roots.Cgroup, b)
	}
	return d
}

// onlineCPUs counts the per-CPU lines (cpu0, cpu1, ...) of /proc/stat:
// the CPUs online, whatever this process's affinity.
func onlineCPUs(stat []byte) int {
	n := 0
	for _, line := range strings.Split(string(stat), "\n") {
		if rest, ok := strings.CutPrefix(line, "cpu"); ok && rest != "" && rest[0] >= '0' && rest[0] <= '9' {
			n++
		}
	}
	return n
}

// cpuQuota returns the tightest CFS quota, in cores, on the path of this
// process's cgroup (the text of /proc/self/cgroup) below root: cpu.max
// for cgroup v2, cpu.cfs_quota_us over cpu.cfs_period_us in the cpu
// controller's hierarchy for v1. 0 means none found.
func cpuQuota(root string, selfCgroup []byte) float64 {
	var quota float64
	tighten := func(q float64) {
		if q > 0 && (quota == 0 || q < quota) {
			quota = q
		}
	}
	sc := bufio.NewScanner(bytes.NewReader(selfCgroup))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; v2 is "0::path".
		f := strings.SplitN(sc.Text(), ":", 3)
		if len(f) != 3 {
			continue
		}
		switch {
		case f[0] == "0" && f[1] == "":
			walkUp(filepath.Join(root, f[2]), root, func(dir string) { tighten(quotaV2(dir)) })
			walkUp(filepath.Join(root, "unified", f[2]), filepath.Join(root, "unified"), func(dir string) { tighten(quotaV2(dir)) })
		case slices.Contains(strings.Split(f[1], ","), "cpu"):
			for _, mount := range []string{f[1], "cpu", "cpu,cpuacct", "cpuacct,cpu"} {
				base := filepath.Join(root, mount)
				walkUp(filepath.Join(base, f[2]), base, func(dir string) { tighten(quotaV1(dir)) })
			}
		}
	}
	return quota
}

// walkUp calls f for dir and each parent up to and including top.
func walkUp(dir, top string, f func(string)) {
	dir, top = filepath.Clean(dir), filepath.Clean(top)
	for {
		f(dir)
		if dir == top || !strings.HasPrefix(dir, top) {
			return
		}
		dir = filepath.Dir(dir)
	}
}

// quotaV2 reads a v2 cpu.max ("max 100000" or "50000 100000").
func quotaV2(dir string) float64 {
	b, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return 0
	}
	return ratio(f[0], f[1])
}

// quotaV1 reads v1's cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us.
func quotaV1(dir string) float64 {
	q, err1 := os.ReadFile(filepath.Join(dir, "cpu.cfs_quota_us"))
	p, err2 := os.ReadFile(filepath.Join(dir, "cpu.cfs_period_us"))
	if err1 != nil || err2 != nil {
		return 0
	}
	return ratio(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

func ratio(quota, period string) float64 {
	q, err1 := strconv.ParseFloat(quota, 64)
	p, err2 := strconv.ParseFloat(period, 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0
	}
	return q / p
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
