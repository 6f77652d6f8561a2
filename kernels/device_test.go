package kernels

import (
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
