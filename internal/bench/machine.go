package bench

import (
	"io"
	"os"
	"runtime"
)

// Machine describes where a report was measured.
type Machine struct {
	Host string `json:"host"`
	OS   string `json:"os"`
	Arch string `json:"arch"`
	CPUs int    `json:"cpus"`
	Go   string `json:"go"`
}

// ThisMachine describes the running machine.
func ThisMachine() Machine {
	host, _ := os.Hostname()
	return Machine{Host: host, OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), Go: runtime.Version()}
}

// ErrWriter keeps the first write error so that formatting code stays
// linear: write everything, then check Err.
type ErrWriter struct {
	W   io.Writer
	Err error
}

func (e *ErrWriter) Write(p []byte) (int, error) {
	if e.Err != nil {
		return 0, e.Err
	}
	n, err := e.W.Write(p)
	e.Err = err
	return n, err
}
