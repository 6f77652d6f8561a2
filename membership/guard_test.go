package membership

import (
	"bytes"
	"testing"

	"github.com/rs/zerolog"

	"github.com/gyre-ml/gyre/internal/floodlog"
)

// TestLogWriterLevels: memberlist's lines keep their level, except news
// that is not the user's concern at warning level: a peer that went away
// (every member does, at a job's end), a probe of a member that does not
// answer (every recovery), a node's own shutdown, and a node restarted
// under its old name taking it back.
func TestLogWriterLevels(t *testing.T) {
	for _, tc := range []struct {
		line string
		want zerolog.Level
	}{
		{"[WARN] memberlist: Was able to connect to 127.0.0.1:7946 over TCP but UDP probes failed", zerolog.WarnLevel},
		{"[ERR] memberlist: Push/Pull with w-1 failed: dial tcp 127.0.0.1:7946: connect: connection refused", zerolog.InfoLevel},
		{"[ERR] memberlist: Failed to send gossip to 127.0.0.1:7946: write: connection refused", zerolog.InfoLevel},
		{"[ERR] memberlist: Failed to accept TCP connection: use of closed network connection", zerolog.DebugLevel},
		{"[ERR] memberlist: Failed to push local state: no route to host", zerolog.ErrorLevel},
		{"[ERR] memberlist: Failed fallback TCP ping: read tcp 127.0.0.1:40000->127.0.0.1:7946: i/o timeout", zerolog.InfoLevel},
		{"[DEBUG] memberlist: Stream connection from=127.0.0.1:5000", zerolog.DebugLevel},
		{"[WARN] memberlist: Refuting an alive message for 'w-1' (127.0.0.1:7946) meta:([1 1 2] VS [1 1 0]), vsn:([1 5 2 0 0 0] VS [1 5 2 0 0 0])", zerolog.InfoLevel},
	} {
		var out bytes.Buffer
		zl := zerolog.New(&out).Level(zerolog.DebugLevel)
		w := &logWriter{log: zl, flood: floodlog.New(floodlog.Config{Logger: zl})}
		w.Write([]byte(tc.line + "\n"))
		if want := `"level":"` + tc.want.String() + `"`; !bytes.Contains(out.Bytes(), []byte(want)) {
			t.Errorf("%q logged as %s, want level %s", tc.line, out.String(), tc.want)
		}
	}
}
