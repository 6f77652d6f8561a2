package config

import (
	"sync/atomic"

	"github.com/rs/zerolog"
)

// RankHook adds the worker's current rank to every log line, as a view
// change can move it; -1 (pending, or not joined yet) adds nothing.
type RankHook struct{ Rank *atomic.Int64 }

func (h RankHook) Run(e *zerolog.Event, _ zerolog.Level, _ string) {
	if r := h.Rank.Load(); r >= 0 {
		e.Int64("rank", r)
	}
}
