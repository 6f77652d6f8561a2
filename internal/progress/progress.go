// Package progress is the live progress line of `gyre train` on a
// terminal, drawn by github.com/schollz/progressbar, and the plain lines
// in which a worker under `gyre launch` hands its progress to the
// launcher, which draws the line instead (the workers write to pipes).
package progress

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// State is what the line shows: a training job's iteration, loss, speed
// and shares, or, with Desc set, any count of Unit (a benchmark's sizes)
// and Desc in words.
type State struct {
	Iter, Total   int64
	Loss          float64
	SamplesPerSec float64
	Shares        []int
	// Unit names what Iter counts ("iter" if empty); Desc, if set,
	// replaces the training figures. Neither may hold a newline.
	Unit, Desc string
}

func (s State) unit() string {
	if s.Unit == "" {
		return "iter"
	}
	return s.Unit
}

func (s State) describe() string {
	if s.Desc != "" {
		return s.Desc
	}
	return fmt.Sprintf("loss %.4f · %.0f samples/s · %d workers · shares %s",
		s.Loss, s.SamplesPerSec, len(s.Shares), joinInts(s.Shares))
}

func joinInts(v []int) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = strconv.Itoa(x)
	}
	return strings.Join(parts, ",")
}

// linePrefix starts a progress line on a worker's output.
const linePrefix = "#gyre-progress "

// Line is the state as one line of a worker's output, for the launcher.
// Desc comes last, as the rest of the line, since it holds spaces.
func (s State) Line() string {
	line := fmt.Sprintf("%siter=%d total=%d loss=%g sps=%g shares=%s", linePrefix, s.Iter, s.Total, s.Loss, s.SamplesPerSec, joinInts(s.Shares))
	if s.Unit != "" {
		line += " unit=" + s.Unit
	}
	if s.Desc != "" {
		line += " desc=" + s.Desc
	}
	return line + "\n"
}

// Parse reads a line State.Line wrote; ok is false for any other line.
func Parse(line []byte) (s State, ok bool) {
	rest, found := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte(linePrefix))
	if !found {
		return State{}, false
	}
	fields, desc, _ := strings.Cut(string(rest), " desc=")
	s.Desc = desc
	for _, field := range strings.Fields(fields) {
		k, v, _ := strings.Cut(field, "=")
		var err error
		switch k {
		case "iter":
			s.Iter, err = strconv.ParseInt(v, 10, 64)
		case "total":
			s.Total, err = strconv.ParseInt(v, 10, 64)
		case "loss":
			s.Loss, err = strconv.ParseFloat(v, 64)
		case "sps":
			s.SamplesPerSec, err = strconv.ParseFloat(v, 64)
		case "unit":
			s.Unit = v
		case "shares":
			if v == "" {
				break // a benchmark's line has none
			}
			for _, p := range strings.Split(v, ",") {
				n, perr := strconv.Atoi(p)
				if perr != nil {
					err = perr
					break
				}
				s.Shares = append(s.Shares, n)
			}
		}
		if err != nil {
			return State{}, false
		}
	}
	return s, true
}

// Bar draws the line on a terminal. Output written through it (Write)
// clears the line first and redraws it after, so the two never mix.
type Bar struct {
	mu    sync.Mutex
	out   io.Writer
	bar   *progressbar.ProgressBar // nil until the first Update
	drawn time.Time                // the last Update drawn
}

// redraw bounds how often Update draws: a fast job ends iterations
// thousands of times a second. (The library's own throttle would also
// skip the redraw after Write, leaving no line.)
const redraw = 100 * time.Millisecond

// NewBar returns a line on out, a terminal, drawn from the first Update.
func NewBar(out io.Writer) *Bar { return &Bar{out: out} }

// Update shows s.
func (b *Bar) Update(s State) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bar == nil {
		b.bar = progressbar.NewOptions64(s.Total,
			progressbar.OptionSetWriter(b.out),
			progressbar.OptionSetWidth(24),
			progressbar.OptionShowCount(),
			progressbar.OptionSetItsString(s.unit()),
			progressbar.OptionShowIts(),
			progressbar.OptionShowDescriptionAtLineEnd(),
		)
	}
	now := time.Now()
	if now.Sub(b.drawn) < redraw && s.Iter < s.Total {
		return
	}
	b.drawn = now
	if s.Total != b.bar.GetMax64() {
		b.bar.ChangeMax64(s.Total)
	}
	// Describe draws too; the count first, so that its drawing is right.
	b.bar.Set64(s.Iter)
	b.bar.Describe(s.describe())
}

// Write passes other output through, above the line.
func (b *Bar) Write(p []byte) (int, error) { return b.writeTo(b.out, p) }

// Also returns a writer for another stream on the same terminal (stderr):
// what goes through it clears the line first too.
func (b *Bar) Also(w io.Writer) io.Writer { return alsoWriter{b, w} }

type alsoWriter struct {
	b *Bar
	w io.Writer
}

func (a alsoWriter) Write(p []byte) (int, error) { return a.b.writeTo(a.w, p) }

func (b *Bar) writeTo(w io.Writer, p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bar == nil {
		return w.Write(p)
	}
	b.bar.Clear()
	n, err := w.Write(p)
	b.bar.RenderBlank()
	return n, err
}

// Finish ends the line, leaving it on the terminal.
func (b *Bar) Finish() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bar != nil {
		b.bar.Exit()
		io.WriteString(b.out, "\n")
		b.bar = nil
	}
}

// Lines writes a worker's progress as State.Line lines, at most one per
// interval (and always the last, on Flush), for the launcher to draw.
type Lines struct {
	out      io.Writer
	interval time.Duration
	last     time.Time
	pending  *State
}

// NewLines writes to out, at most every interval.
func NewLines(out io.Writer, interval time.Duration) *Lines {
	return &Lines{out: out, interval: interval}
}

// Update reports s, now or with a later one.
func (l *Lines) Update(s State) {
	if now := time.Now(); now.Sub(l.last) >= l.interval {
		l.last, l.pending = now, nil
		io.WriteString(l.out, s.Line())
		return
	}
	l.pending = &s
}

// Flush writes the last state if it is still pending.
func (l *Lines) Flush() {
	if l.pending != nil {
		io.WriteString(l.out, l.pending.Line())
		l.pending = nil
	}
}
