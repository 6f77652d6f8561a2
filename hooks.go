package gyre

import "time"

// SpanKind names a phase of an iteration on the trainer's side.
type SpanKind uint8

// Trainer-side span kinds.
const (
	SpanForward SpanKind = iota + 1
	SpanBackward
	SpanStep // the optimizer step
	SpanEval
)

func (k SpanKind) String() string {
	switch k {
	case SpanForward:
		return "forward"
	case SpanBackward:
		return "backward"
	case SpanStep:
		return "step"
	case SpanEval:
		return "eval"
	}
	return "span"
}

// Span is one timed phase of one iteration.
type Span struct {
	Kind       SpanKind
	Iter       int64
	Rank       int
	Start, End time.Time
}

// Hooks receive events from a Worker. Nil fields are skipped. Hooks run on
// the trainer's goroutine and should return quickly.
type Hooks struct {
	// Span is called when a span started with Worker.StartSpan ends.
	Span func(Span)
}

// StartSpan starts timing a trainer-side phase of the current iteration
// and returns the function that ends it, which reports the span to the
// Span hook:
//
//	end := w.StartSpan(gyre.SpanForward)
//	loss := model.Forward(x)
//	end()
func (w *Worker) StartSpan(kind SpanKind) (end func()) {
	so := w.e.SpanObserver()
	if w.hooks.Span == nil && so == nil {
		return func() {}
	}
	s := Span{Kind: kind, Iter: w.e.Iter(), Rank: w.e.Rank(), Start: time.Now()}
	return func() {
		s.End = time.Now()
		if w.hooks.Span != nil {
			w.hooks.Span(s)
		}
		if so != nil {
			so.Span(kind.String(), s.Iter, s.Start, s.End)
		}
	}
}
