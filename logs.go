package gyre

import (
	"io"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/config"
)

// Environment variables that choose the runtime's logs, as `gyre launch`
// sets them for its workers. ConfigFromEnv builds Config.Logger from them
// when either is set.
const (
	// EnvLogLevel is debug, info, warn or error; default warn.
	EnvLogLevel = config.EnvLogLevel
	// EnvLogFormat is auto (console lines on a terminal, else JSON), json
	// or console; default auto.
	EnvLogFormat = config.EnvLogFormat
)

// NewLogger returns a logger writing to w at level (debug, info, warn or
// error) in format: auto (console lines on a terminal, else JSON lines),
// json or console. Every line carries its time.
func NewLogger(w io.Writer, level, format string) (zerolog.Logger, error) {
	return config.NewLogger(w, level, format)
}
