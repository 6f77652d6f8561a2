// Package floodlog logs refused connections without letting a flood of
// them flood the log. Within each window (10 s by default) the first few
// refusals of each kind are logged one by one, with their reasons, up to
// a few in all; the rest are counted, and one line at the window's end
// sums them up with the sources that sent the most. A port hammered by
// 10,000 junk connections a second thus writes at most 5 lines every
// 10 s, not 10,000, and a refusal of another kind amid the flood (a worker
// with the wrong cluster secret) still shows.
//
// The transports log refused data-plane connections through it, and
// package membership the gossip port's.
package floodlog

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Defaults for the zero values of Config.
const (
	DefaultBurst  = 2
	DefaultTotal  = 4
	DefaultWindow = 10 * time.Second
)

// maxSources bounds the distinct sources counted in one window; the rest
// are counted as "other", so that a flood from many addresses costs
// bounded memory.
const maxSources = 256

// topSources is how many sources a summary names.
const topSources = 3

// Config configures a Log.
type Config struct {
	// Logger receives the lines.
	Logger zerolog.Logger
	// What names what is refused, in the summary: "connections to the
	// data port".
	What string
	// Burst is how many refusals of one kind per window are logged one by
	// one, and Total how many of all kinds. Defaults DefaultBurst and
	// DefaultTotal. A flood thus writes at most Total lines and a summary
	// per window, and at most 2·Total+1 in any stretch of one window's
	// length.
	Burst, Total int
	// Window is the window's length. Default DefaultWindow.
	Window time.Duration
	// Every logs every refusal, with no limit: for tests that read them.
	Every bool
}

// Log is a rate-limited log of refusals. Its methods are safe for
// concurrent use.
type Log struct {
	cfg Config

	mu         sync.Mutex
	inWindow   bool // a window is open: it began at the first refusal since the last summary
	logged     int
	byKind     map[string]int // refusals logged one by one in the window, by kind
	suppressed int
	sources    map[string]int // by host, for suppressed refusals
	timer      *time.Timer
	closed     bool
}

// New returns a Log.
func New(cfg Config) *Log {
	if cfg.Burst <= 0 {
		cfg.Burst = DefaultBurst
	}
	if cfg.Total <= 0 {
		cfg.Total = DefaultTotal
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Every {
		cfg.Burst, cfg.Total = math.MaxInt, math.MaxInt
	}
	return &Log{cfg: cfg, sources: make(map[string]int), byKind: make(map[string]int)}
}

// Refused logs a warning with message msg about one refusal from remote
// (host:port or a host), with the fields that fields adds (nil: none),
// while the window's bursts last; msg is also the refusal's kind. After
// that it only counts the refusal for the window's summary, and fields is
// not called. The line is written under the Log's lock, so that none is
// written after Close: the goroutines of a network library may refuse a
// connection after its owner has closed.
func (l *Log) Refused(remote, msg string, fields func(*zerolog.Event) *zerolog.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if !l.inWindow {
		l.inWindow = true
		l.timer = time.AfterFunc(l.cfg.Window, l.endWindow)
	}
	if l.logged < l.cfg.Total && l.byKind[msg] < l.cfg.Burst {
		l.logged++
		l.byKind[msg]++
		ev := l.cfg.Logger.Warn().Str("remote", remote)
		if l.byKind[msg] == l.cfg.Burst || l.logged == l.cfg.Total {
			ev = ev.Str("then", fmt.Sprintf("further refusals are summed up every %v", l.cfg.Window))
		}
		if fields != nil {
			ev = fields(ev)
		}
		ev.Msg(msg)
		return
	}
	l.suppressed++
	host := hostOf(remote)
	if _, ok := l.sources[host]; ok || len(l.sources) < maxSources {
		l.sources[host]++
	} else {
		l.sources["other"]++
	}
}

// endWindow writes the window's summary, if it suppressed any refusal,
// and closes the window: the next refusal opens a new one.
func (l *Log) endWindow() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.summaryLocked()
	l.inWindow, l.logged = false, 0
	clear(l.byKind)
}

func (l *Log) summaryLocked() {
	if l.suppressed == 0 {
		return
	}
	hosts := slices.SortedFunc(maps.Keys(l.sources), func(a, b string) int {
		return cmp.Or(cmp.Compare(l.sources[b], l.sources[a]), strings.Compare(a, b))
	})
	var top []string
	for _, h := range hosts[:min(len(hosts), topSources)] {
		top = append(top, fmt.Sprintf("%s (%d)", h, l.sources[h]))
	}
	l.cfg.Logger.Warn().Int("refused", l.suppressed).Dur("window", l.cfg.Window).Strs("top_sources", top).
		Msgf("refused %d more %s in the last %v without logging each; most from %s",
			l.suppressed, l.cfg.What, l.cfg.Window, strings.Join(top, ", "))
	l.suppressed = 0
	clear(l.sources)
}

// Close writes the open window's summary at once and stops the Log;
// later refusals are not logged. It is idempotent.
func (l *Log) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.summaryLocked()
}

// hostOf returns remote's host, or remote itself if it has no port.
func hostOf(remote string) string {
	if h, _, err := net.SplitHostPort(remote); err == nil {
		return h
	}
	return remote
}

// TimedOut reports whether err, which ended an incoming handshake, is a
// timeout: the client went silent mid-handshake (killed, stopped or cut
// off), as peers do during a recovery. That is no refusal: the
// transports log it at debug level, not in the flood log.
func TimedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}
