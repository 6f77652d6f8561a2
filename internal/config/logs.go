package config

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
)

// Environment variables that choose the runtime's logs, as `gyre launch`
// sets them for its workers. ConfigFromEnv builds Config.Logger from them
// when either is set.
const (
	// EnvLogLevel is debug, info, warn or error; default warn.
	EnvLogLevel = "GYRE_LOG_LEVEL"
	// EnvLogFormat is auto (console lines on a terminal, else JSON), json
	// or console; default auto.
	EnvLogFormat = "GYRE_LOG_FORMAT"
)

// NewLogger returns a logger writing to w at level (debug, info, warn or
// error) in format: auto (console lines on a terminal, else JSON lines),
// json or console. Every line carries its time.
func NewLogger(w io.Writer, level, format string) (zerolog.Logger, error) {
	var lvl zerolog.Level
	switch strings.ToLower(level) {
	case "debug":
		lvl = zerolog.DebugLevel
	case "info":
		lvl = zerolog.InfoLevel
	case "warn", "warning":
		lvl = zerolog.WarnLevel
	case "error":
		lvl = zerolog.ErrorLevel
	default:
		return zerolog.Nop(), fmt.Errorf("log level %q: want debug, info, warn or error", level)
	}
	switch strings.ToLower(format) {
	case "auto":
		if isTerminal(w) {
			w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05"}
		}
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: "15:04:05", NoColor: !isTerminal(w)}
	default:
		return zerolog.Nop(), fmt.Errorf("log format %q: want auto, json or console", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// defaultLogger is Config.Logger's default: warnings and errors on
// stderr, as console lines, so that they read well on a terminal and in a
// log file alike.
func defaultLogger() zerolog.Logger {
	l, _ := NewLogger(os.Stderr, "warn", "console")
	return l
}

// loggerFromEnv builds the logger EnvLogLevel and EnvLogFormat ask for,
// or returns nil if neither is set.
func loggerFromEnv(lookup func(string) (string, bool)) (*zerolog.Logger, error) {
	level, lok := lookup(EnvLogLevel)
	format, fok := lookup(EnvLogFormat)
	level, format = strings.TrimSpace(level), strings.TrimSpace(format)
	if (!lok || level == "") && (!fok || format == "") {
		return nil, nil
	}
	if level == "" {
		level = "warn"
	}
	if format == "" {
		format = "auto"
	}
	l, err := NewLogger(os.Stderr, level, format)
	if err != nil {
		return nil, fmt.Errorf("%w: %s=%q, %s=%q: %v", ErrConfig, EnvLogLevel, level, EnvLogFormat, format, err)
	}
	return &l, nil
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && (isatty.IsTerminal(f.Fd()) || isatty.IsCygwinTerminal(f.Fd()))
}
