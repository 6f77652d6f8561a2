package launch

import (
	"bytes"
	"io"
)

// prefixWriter puts prefix before every line written through it and
// passes complete lines on in one Write. A trailing partial line waits for
// its newline or for Flush. seen, if set, also gets each line, unprefixed;
// a line that take, if set, returns true for goes no further.
type prefixWriter struct {
	prefix []byte
	out    io.Writer
	line   []byte
	seen   func(line []byte)
	take   func(line []byte) bool
}

// maxLine bounds a buffered partial line; past it the line is passed on
// unfinished, so a child printing without newlines cannot grow memory.
const maxLine = 64 << 10

func (p *prefixWriter) Write(b []byte) (int, error) {
	n := len(b)
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			p.line = append(p.line, b...)
			if len(p.line) >= maxLine {
				return n, p.Flush()
			}
			return n, nil
		}
		p.line = append(p.line, b[:i+1]...)
		b = b[i+1:]
		if err := p.emit(); err != nil {
			return n, err
		}
	}
	return n, nil
}

// Flush passes on a pending partial line, ending it with a newline.
func (p *prefixWriter) Flush() error {
	if len(p.line) == 0 {
		return nil
	}
	p.line = append(p.line, '\n')
	return p.emit()
}

func (p *prefixWriter) emit() error {
	if p.seen != nil {
		p.seen(p.line)
	}
	if p.take != nil && p.take(p.line) {
		p.line = p.line[:0]
		return nil
	}
	buf := make([]byte, 0, len(p.prefix)+len(p.line))
	buf = append(append(buf, p.prefix...), p.line...)
	p.line = p.line[:0]
	_, err := p.out.Write(buf)
	return err
}
