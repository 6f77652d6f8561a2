package obs

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
)

// TraceFile is one worker's timeline, as Merge reads it.
type TraceFile struct {
	Name   string // for errors and the report
	Events []json.RawMessage
}

// ReadTrace reads a timeline Trace wrote, accepting one whose closing
// bracket is missing (a worker killed before Close).
func ReadTrace(name string, r io.Reader) (TraceFile, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return TraceFile{}, err
	}
	b = bytes.TrimSpace(b)
	var evs []json.RawMessage
	if err := json.Unmarshal(b, &evs); err == nil {
		return TraceFile{Name: name, Events: evs}, nil
	}
	// A file cut short: Trace writes "[" and then one event per line, so
	// every whole line is an event, and a last line cut mid-event is
	// dropped.
	lines := bytes.Split(b, []byte("\n"))
	if len(lines) == 0 || string(bytes.TrimSpace(lines[0])) != "[" {
		return TraceFile{}, fmt.Errorf("obs: %s is not a trace-event JSON array", name)
	}
	for i, line := range lines[1:] {
		line = bytes.TrimSuffix(bytes.TrimSpace(line), []byte(","))
		if len(line) == 0 || string(line) == "]" {
			continue
		}
		if !json.Valid(line) {
			if i == len(lines)-2 {
				break // the last line, cut off
			}
			return TraceFile{}, fmt.Errorf("obs: %s: line %d is not a trace event", name, i+2)
		}
		evs = append(evs, json.RawMessage(line))
	}
	return TraceFile{Name: name, Events: evs}, nil
}

// Offset is the shift Merge applied to one file's timestamps.
type Offset struct {
	Name string
	// Micros is added to every timestamp of the file; Boundaries is how
	// many boundaries it shares with the reference file, the first.
	Micros     float64
	Boundaries int
	// Spread is the largest distance, in microseconds, between this
	// file's boundary ends and the reference's after the shift.
	Spread float64
}

// boundaryKey names a boundary: the iteration it ended and the epoch of
// the view it led to, so that an iteration redone after a recovery is
// another boundary.
type boundaryKey struct {
	epoch uint64
	iter  int64
}

// boundaryEnds maps each boundary to the time it ended.
func boundaryEnds(f TraceFile) (map[boundaryKey]float64, error) {
	ends := map[boundaryKey]float64{}
	for _, raw := range f.Events {
		var e struct {
			Name string  `json:"name"`
			Ph   string  `json:"ph"`
			Ts   float64 `json:"ts"`
			Dur  float64 `json:"dur"`
			Args struct {
				Iter  *int64 `json:"iter"`
				Epoch uint64 `json:"epoch"`
				Error string `json:"error"`
			} `json:"args"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, fmt.Errorf("obs: %s: %w", f.Name, err)
		}
		if e.Ph == "X" && e.Name == "boundary" && e.Args.Iter != nil && e.Args.Error == "" {
			ends[boundaryKey{e.Args.Epoch, *e.Args.Iter}] = e.Ts + e.Dur
		}
	}
	return ends, nil
}

// Merge combines workers' timelines into one, on the first file's
// clock. Every worker leaves a boundary when the same vote completes, so
// the boundaries are where the clocks can be compared: each file's
// offset is the median, over the boundaries (iteration and epoch) both
// files have, of the difference between their ends. Every file must
// share boundaries with the first: put a worker that ran throughout
// first. Files from the
// same process id (two workers that joined at the same rank at
// different times) keep their own tracks: later ones get new ids.
func Merge(files []TraceFile) ([]json.RawMessage, []Offset, error) {
	if len(files) == 0 {
		return nil, nil, fmt.Errorf("obs: no timelines to merge")
	}
	ref, err := boundaryEnds(files[0])
	if err != nil {
		return nil, nil, err
	}
	var merged []json.RawMessage
	var offsets []Offset
	usedPids := map[float64]bool{}
	for i, f := range files {
		ends, err := boundaryEnds(f)
		if err != nil {
			return nil, nil, err
		}
		var diffs []float64
		for key, end := range ends {
			if r, ok := ref[key]; ok {
				diffs = append(diffs, r-end)
			}
		}
		if i > 0 && len(diffs) == 0 {
			return nil, nil, fmt.Errorf("obs: %s shares no boundary with %s: their clocks cannot be compared", f.Name, files[0].Name)
		}
		off := Offset{Name: f.Name, Boundaries: len(diffs)}
		if len(diffs) > 0 {
			slices.Sort(diffs)
			off.Micros = diffs[len(diffs)/2]
			for _, d := range diffs {
				off.Spread = max(off.Spread, abs(d-off.Micros))
			}
		}
		offsets = append(offsets, off)
		pidMap := map[float64]float64{}
		for _, raw := range f.Events {
			var e map[string]any
			if err := json.Unmarshal(raw, &e); err != nil {
				return nil, nil, fmt.Errorf("obs: %s: %w", f.Name, err)
			}
			if pid, ok := e["pid"].(float64); ok {
				to, seen := pidMap[pid]
				if !seen {
					to = pid
					for usedPids[to] {
						to += 1000
					}
					usedPids[to], pidMap[pid] = true, to
				}
				e["pid"] = to
			}
			if ts, ok := e["ts"].(float64); ok && e["ph"] != "M" {
				e["ts"] = ts + off.Micros
			}
			b, err := json.Marshal(e)
			if err != nil {
				return nil, nil, err
			}
			merged = append(merged, b)
		}
	}
	return merged, offsets, nil
}

func abs(v float64) float64 {
	if v < 0 {
		return -v
	}
	return v
}

// WriteTrace writes events as a trace-event JSON array, one per line.
func WriteTrace(w io.Writer, events []json.RawMessage) error {
	bw := bufio.NewWriter(w)
	bw.WriteString("[\n")
	for i, e := range events {
		if i > 0 {
			bw.WriteString(",\n")
		}
		bw.Write(e)
	}
	bw.WriteString("\n]\n")
	return bw.Flush()
}
