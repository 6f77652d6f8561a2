package main

import (
	"io"
	"time"

	"github.com/gyre-ml/gyre/internal/progress"
)

// envProgress set to progressLines makes rank 0 of `gyre train` or
// `gyre bench allreduce` write its progress as plain lines
// (progress.State.Line) every progressInterval, for gyre launch to draw on
// its terminal.
const (
	envProgress      = "GYRE_PROGRESS"
	progressLines    = "lines"
	progressInterval = 200 * time.Millisecond
)

// liveLine is a worker's progress line: drawn on its terminal, handed to
// gyre launch as plain lines when launch asks (its workers write to
// pipes), or nowhere.
type liveLine struct {
	bar   *progress.Bar
	lines *progress.Lines
}

// newLiveLine returns the line for output out, and the writer the
// command's other output must go through so the two never mix.
func (c *cli) newLiveLine(out io.Writer) (*liveLine, io.Writer) {
	switch {
	case isTerminal(out):
		bar := progress.NewBar(out)
		return &liveLine{bar: bar}, bar
	case lookupIs(c.env.lookup, envProgress, progressLines):
		return &liveLine{lines: progress.NewLines(out, progressInterval)}, out
	}
	return &liveLine{}, out
}

// on says whether the line goes anywhere.
func (l *liveLine) on() bool { return l.bar != nil || l.lines != nil }

// update shows s.
func (l *liveLine) update(s progress.State) {
	switch {
	case l.bar != nil:
		l.bar.Update(s)
	case l.lines != nil:
		l.lines.Update(s)
	}
}

// finish leaves the last state shown.
func (l *liveLine) finish() {
	switch {
	case l.bar != nil:
		l.bar.Finish()
	case l.lines != nil:
		l.lines.Flush()
	}
}
