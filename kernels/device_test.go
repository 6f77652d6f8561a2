package kernels

import (
	"math"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func TestProbe(t *testing.T) {
	d := Probe()
	if d.Kind != KindCPU || d.Cores != runtime.NumCPU() || d.Name == "" {
		t.Fatalf("Probe() = %v", d)
	}
	if runtime.GOOS == "linux" && (d.MemoryBytes == 0 || d.Name == "unknown") {
		t.Errorf("Probe() on Linux did not read /proc: %v", d)
	}
	t.Log(d)
}

func TestCPUModel(t *testing.T) {
	tests := []struct{ name, in, want string }{
		{"x86", "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\nflags\t\t: fpu\n\nprocessor\t: 1\nmodel name\t: Intel(R) Xeon(R) Processor\n", "Intel(R) Xeon(R) Processor"},
		{"arm", "processor\t: 0\nBogoMIPS\t: 48.00\nCPU part\t: 0xd0c\n\nHardware\t: BCM2835\n", "BCM2835"},
		{"ppc", "processor\t: 0\ncpu\t\t: POWER9 (raw), altivec supported\n", "POWER9 (raw), altivec supported"},
		{"empty model", "model name\t: \ncpu model\t: R4000\n", "R4000"},
		{"none", "processor\t: 0\n", ""},
		{"garbage", "\x00\xff no colon here", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := cpuModel([]byte(tt.in)); got != tt.want {
				t.Errorf("cpuModel = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestMemInfo(t *testing.T) {
	total, avail := memInfo([]byte("MemTotal:       24575996 kB\nMemFree:        1000 kB\nMemAvailable:   20000000 kB\nBogus: x kB\nHugePages_Total:       0\n"))
	if total != 24575996*1024 || avail != 20000000*1024 {
		t.Fatalf("memInfo = %d, %d", total, avail)
	}
	if total, avail := memInfo(nil); total != 0 || avail != 0 {
		t.Fatalf("memInfo(nil) = %d, %d", total, avail)
	}
}

// fakeTree writes files (path relative to dir → content) and returns dir.
func fakeTree(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestCPUQuota reads the CFS quota from fake cgroup trees: v1 with the cpu
// controller mounted alone or with cpuacct, v2, nested cgroups whose
// parent is tighter, no quota, and no cgroup files at all (as inside a
// network namespace that remounted /sys).
func TestCPUQuota(t *testing.T) {
	for _, tt := range []struct {
		name  string
		files map[string]string
		want  float64
	}{
		{"v1 cpu,cpuacct", map[string]string{
			"proc/self/cgroup":                            "4:memory:/job\n3:cpu,cpuacct:/job/w1\n0::/\n",
			"cgroup/cpu,cpuacct/job/w1/cpu.cfs_quota_us":  "25000\n",
			"cgroup/cpu,cpuacct/job/w1/cpu.cfs_period_us": "100000\n",
		}, 0.25},
		{"v1 cpu alone, parent tighter", map[string]string{
			"proc/self/cgroup":                 "2:cpuacct:/\n1:cpu:/a/b\n",
			"cgroup/cpu/a/b/cpu.cfs_quota_us":  "150000",
			"cgroup/cpu/a/b/cpu.cfs_period_us": "100000",
			"cgroup/cpu/a/cpu.cfs_quota_us":    "50000",
			"cgroup/cpu/a/cpu.cfs_period_us":   "100000",
			"cgroup/cpu/cpu.cfs_quota_us":      "-1",
			"cgroup/cpu/cpu.cfs_period_us":     "100000",
		}, 0.5},
		{"v1 no quota", map[string]string{
			"proc/self/cgroup":             "1:cpu:/\n",
			"cgroup/cpu/cpu.cfs_quota_us":  "-1",
			"cgroup/cpu/cpu.cfs_period_us": "100000",
		}, 0},
		{"v2", map[string]string{
			"proc/self/cgroup":             "0::/user.slice/w1\n",
			"cgroup/user.slice/w1/cpu.max": "150000 100000\n",
			"cgroup/user.slice/cpu.max":    "max 100000\n",
		}, 1.5},
		{"v2 parent tighter", map[string]string{
			"proc/self/cgroup":      "0::/job/w1\n",
			"cgroup/job/w1/cpu.max": "max 100000\n",
			"cgroup/job/cpu.max":    "15000 100000\n",
		}, 0.15},
		{"no cgroup files", map[string]string{"proc/self/cgroup": "0::/gone\n"}, 0},
		{"garbage", map[string]string{
			"proc/self/cgroup": "nonsense\n0::/x\n",
			"cgroup/x/cpu.max": "lots 0",
		}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := fakeTree(t, tt.files)
			d := ProbeRoots(Roots{Proc: filepath.Join(dir, "proc"), Cgroup: filepath.Join(dir, "cgroup")})
			if math.Abs(d.CPUQuota-tt.want) > 1e-12 {
				t.Fatalf("CPUQuota %v, want %v", d.CPUQuota, tt.want)
			}
			if want := math.Min(float64(runtime.NumCPU()), tt.want); tt.want > 0 && d.Usable() != want {
				t.Fatalf("Usable %v, want %v", d.Usable(), want)
			}
			if d.Kind != KindCPU || d.Name != "unknown" || d.Cores != runtime.NumCPU() {
				t.Fatalf("a probe of a tree without cpuinfo: %+v", d)
			}
		})
	}
}

// TestProbeLoad reads the load average, the online CPUs and the boot id
// from a fake /proc.
func TestProbeLoad(t *testing.T) {
	dir := fakeTree(t, map[string]string{"proc/loadavg": "3.25 2.00 1.00 2/300 1234\n",
		"proc/stat":                      "cpu  10 0 5 100\ncpu0 5 0 2 50\ncpu1 5 0 3 50\ncpu12 0 0 0 0\nintr 12345\ncpufreq x\n",
		"proc/sys/kernel/random/boot_id": "f94e82de-b5c7-4014-96b9-c390a0a78fbb\n"})
	d := ProbeRoots(Roots{Proc: filepath.Join(dir, "proc"), Cgroup: dir})
	if d.Load != 3.25 || d.CPUQuota != 0 || d.Online != 3 || d.Boot != "f94e82de-b5c7-4014-96b9-c390a0a78fbb" {
		t.Fatalf("Load %v, CPUQuota %v, Online %d, Boot %q (want 3.25, 0, 3 and the file's id)", d.Load, d.CPUQuota, d.Online, d.Boot)
	}
}
