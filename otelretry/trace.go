package otelretry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"sync"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/herdproof/retryhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Trace makes t trace its attempts and returns the RoundTripper to use in
// its place. Each attempt is a client span, in OpenTelemetry's HTTP
// conventions. Its parent is the request's span: the client span of an
// otelhttp.NewTransport above, or one Trace starts.
//
// The spans come from a tracer of tp. A nil tp means
// otel.GetTracerProvider. The propagator prop injects each attempt's span
// into a copy of its headers. A nil prop means otel.GetTextMapPropagator,
// read for every attempt.
//
// Trace wraps t.Base and chains t.OnAttempt: a hook t already has runs
// after the tracing. Call it before t's first use.
//
// A request is traced when its context holds a span, or when tp records.
// Otherwise it goes to t as it came, at no cost.
func Trace(t *retryhttp.Transport, tp trace.TracerProvider, prop propagation.TextMapPropagator) http.RoundTripper {
	tc := &tracing{next: t, prop: prop}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	tc.tracer = tp.Tracer(ScopeName)
	if isGlobalDelegate(tp) {
		tc.unset = tp
	}
	_, tc.noop = tp.(noop.TracerProvider)
	base := t.Base
	if base == nil { // the Transport's own default
		b := cleanhttp.DefaultPooledTransport()
		b.OnProxyConnectResponse = retryhttp.CheckProxyConnect
		base = b
	}
	tc.base = &tracedBase{tc: tc, next: base}
	t.Base = tc.base
	next := t.OnAttempt
	t.OnAttempt = func(a retryhttp.Attempt) {
		tc.attempted(a)
		if next != nil {
			next(a)
		}
	}
	return tc
}

// Attribute keys of the project's own, beside the HTTP conventions'.
const (
	keyDecision    = attribute.Key("retryhttp.decision")
	keyClass       = attribute.Key("retryhttp.class")
	keyAttempts    = attribute.Key("retryhttp.attempts")
	keyHedge       = attribute.Key("retryhttp.hedge")
	keyDelay       = attribute.Key("retryhttp.delay")
	keyDelaySource = attribute.Key("retryhttp.delay_source")
)

// waitEvent is the name of the event recorded for each wait.
const waitEvent = "retryhttp.wait"

// tracing is what Trace returns: the traced Transport, and the tracer.
type tracing struct {
	next   http.RoundTripper // the Transport
	base   *tracedBase
	prop   propagation.TextMapPropagator // nil: the global's
	tracer trace.Tracer
	unset  trace.TracerProvider // the global provider, while none is set
	noop   bool
}

// isGlobalDelegate reports whether tp is otel's global provider before
// one is set: it forwards to the provider set later.
func isGlobalDelegate(tp trace.TracerProvider) bool {
	t := reflect.TypeOf(tp)
	return t != nil && t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// on reports whether a request with ctx is traced: its context holds a
// span, or the provider records.
func (tc *tracing) on(ctx context.Context) bool {
	switch {
	case trace.SpanContextFromContext(ctx).IsValid():
		return true
	case tc.noop:
		return false
	case tc.unset != nil:
		return otel.GetTracerProvider() != tc.unset // set since
	}
	return true
}

func (tc *tracing) propagator() propagation.TextMapPropagator {
	if tc.prop != nil {
		return tc.prop
	}
	return otel.GetTextMapPropagator()
}

// RoundTrip traces req through the Transport.
func (tc *tracing) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	if !tc.on(ctx) {
		return tc.next.RoundTrip(req)
	}
	st := &request{tc: tc, attrs: urlAttrs(req)}
	var own trace.Span
	if parent := trace.SpanFromContext(ctx); !isClientSpan(parent) {
		ctx, own = tc.tracer.Start(ctx, "retryhttp "+spanName(req), trace.WithSpanKind(trace.SpanKindInternal),
			trace.WithAttributes(st.attrs...))
	}
	st.span = trace.SpanFromContext(ctx)
	defer st.close(own)
	resp, err := tc.next.RoundTrip(req.WithContext(context.WithValue(ctx, stateKey{}, st)))
	st.ended(err)
	if own != nil {
		if err != nil {
			own.SetAttributes(errorType(err))
			own.SetStatus(codes.Error, err.Error()) // an *Error's text is redacted
		} else {
			own.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
			if resp.StatusCode >= 400 {
				own.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(resp.StatusCode)))
				own.SetStatus(codes.Error, "")
			}
		}
	}
	return resp, err
}

// CloseIdleConnections closes the Transport's idle connections.
func (tc *tracing) CloseIdleConnections() {
	if c, ok := tc.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// isClientSpan reports whether s is a client span of this process: the
// request's span of an otelhttp.NewTransport above, say.
func isClientSpan(s trace.Span) bool {
	k, ok := s.(interface{ SpanKind() trace.SpanKind }) // the SDK's spans
	return ok && s.IsRecording() && k.SpanKind() == trace.SpanKindClient
}

type stateKey struct{}

// request is one traced request: its span, and a span per attempt.
type request struct {
	tc    *tracing
	span  trace.Span // the request's, its own or otelhttp's
	attrs []attribute.KeyValue

	mu      sync.Mutex
	spans   []*attemptSpan     // by attempt number less one; nil for a copy not yet sent
	decided int                // attempts whose decision is made
	last    retryhttp.Decision // the last decision made
	answers int                // answers come in so far, to order them
}

// An attemptSpan is one attempt's span, and what its base answered.
type attemptSpan struct {
	span     trace.Span
	ctx      context.Context // the attempt's
	start    time.Time
	answered int // the order of its answer, from 1; 0 while it runs
	status   int
	err      error
	decided  bool // its attempt's decision is made: it ends with its answer
	ended    bool
}

// stateOf returns the traced request ctx belongs to, if it is tc's.
func (tc *tracing) stateOf(ctx context.Context) *request {
	st, _ := ctx.Value(stateKey{}).(*request)
	if st == nil || st.tc != tc {
		return nil
	}
	return st
}

// A tracedBase is the Transport's Base under Trace: it sends each
// attempt of a traced request in a span of its own.
type tracedBase struct {
	tc   *tracing
	next http.RoundTripper
}

func (b *tracedBase) RoundTrip(req *http.Request) (*http.Response, error) {
	st := b.tc.stateOf(req.Context())
	if st == nil {
		return b.next.RoundTrip(req)
	}
	return st.attempt(b.next, req)
}

// CloseIdleConnections closes the base's idle connections.
func (b *tracedBase) CloseIdleConnections() {
	if c, ok := b.next.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// attempt sends req through base in a client span. The span's context is
// injected into a copy of req's headers: req may be the caller's.
func (st *request) attempt(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	as := &attemptSpan{start: time.Now()}
	st.mu.Lock()
	n := st.number(ctx.Err() != nil)
	st.spans[n-1] = as
	attrs := append(make([]attribute.KeyValue, 0, len(st.attrs)+1), st.attrs...)
	if n > 1 {
		attrs = append(attrs, semconv.HTTPRequestResendCount(n-1))
	}
	ctx, as.span = st.tc.tracer.Start(ctx, spanName(req), trace.WithSpanKind(trace.SpanKindClient),
		trace.WithTimestamp(as.start), trace.WithAttributes(attrs...))
	as.ctx = req.Context()
	if n <= st.decided { // a late copy: its attempt's decision is made
		as.decided = true
		as.span.SetAttributes(keyHedge.String("lost"))
	}
	st.mu.Unlock()

	out := req.WithContext(ctx)
	out.Header = req.Header.Clone()
	if out.Header == nil {
		out.Header = http.Header{}
	}
	st.tc.propagator().Inject(ctx, propagation.HeaderCarrier(out.Header))
	resp, err := base.RoundTrip(out)

	st.mu.Lock()
	defer st.mu.Unlock()
	st.answers++
	as.answered, as.err = st.answers, err
	if resp != nil {
		as.status = resp.StatusCode
	}
	if as.decided && !as.ended { // a hedged copy that lost, answering late
		as.endAlone()
	}
	return resp, err
}

// number gives the attempt being sent its number, under st.mu. A copy
// whose context has ended before it was sent is a hedged copy that lost
// and started late: it takes a number its attempt left unused.
func (st *request) number(late bool) int {
	n := max(len(st.spans), st.decided) + 1
	if late {
		for i := range st.decided {
			if i >= len(st.spans) || st.spans[i] == nil {
				n = i + 1
				break
			}
		}
	}
	for len(st.spans) < n {
		st.spans = append(st.spans, nil)
	}
	return n
}

// endAlone ends a span by its own answer, as a hedged copy that lost.
func (as *attemptSpan) endAlone() {
	switch {
	case as.err != nil:
		as.span.SetAttributes(errorType(as.err))
		as.span.SetStatus(codes.Error, "")
	case as.status != 0:
		as.span.SetAttributes(semconv.HTTPResponseStatusCode(as.status))
		if as.status >= 400 {
			as.span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(as.status)))
			as.span.SetStatus(codes.Error, "")
		}
	}
	as.span.End()
	as.ended = true
}

// attempted records the decision after an attempt: on the span of the
// copy whose answer it was, and on the request's span as a wait.
func (tc *tracing) attempted(a retryhttp.Attempt) {
	if a.Request == nil {
		return
	}
	st := tc.stateOf(a.Request.Context())
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	first, last := a.Number-1, min(a.Number-1+a.Hedges, len(st.spans)-1)
	st.decided = max(st.decided, a.Number+a.Hedges)
	st.last = a.Decision
	if first < 0 || first > last {
		return
	}
	winner, matched := first, false
	if a.Hedges > 0 {
		if w := st.winner(first, last, a); w >= 0 {
			winner, matched = w, true
		}
	}
	if s := st.spans[first]; s != nil && a.PermitWait > 0 {
		st.span.AddEvent(waitEvent, trace.WithTimestamp(s.start.Add(-a.PermitWait)), trace.WithAttributes(
			keyDelay.Float64(a.PermitWait.Seconds()), keyDelaySource.String("limiter")))
	}
	for i := first; i <= last; i++ {
		as := st.spans[i]
		if as == nil {
			continue
		}
		as.decided = true
		if i != winner {
			as.span.SetAttributes(keyHedge.String("lost"))
			if as.answered > 0 {
				as.endAlone()
			}
			continue
		}
		if matched {
			as.span.SetAttributes(keyHedge.String("won"))
		}
		as.span.SetAttributes(keyClass.String(a.Class.String()), keyDecision.String(a.Decision.String()))
		if a.Err != nil {
			as.span.SetAttributes(errorType(a.Err))
			as.span.SetStatus(codes.Error, errText(a))
		} else {
			as.span.SetAttributes(semconv.HTTPResponseStatusCode(a.Status))
			if a.Status >= 400 {
				as.span.SetAttributes(semconv.ErrorTypeKey.String(strconv.Itoa(a.Status)))
				as.span.SetStatus(codes.Error, "")
			}
		}
		as.span.End()
		as.ended = true
	}
	if a.Decision == retryhttp.Retry {
		st.span.AddEvent(waitEvent, trace.WithAttributes(
			keyDelay.Float64(a.Delay.Seconds()), keyDelaySource.String(delaySource(a))))
	}
}

// winner is the copy of a hedged attempt whose answer was the attempt's:
// the one that answered a's error (or neither a response nor an error,
// which the Transport turns into an error), or a's status. Among copies with the
// same status, the race kept the one whose context is still alive (the
// others were canceled as it ended), and of those the last to answer.
func (st *request) winner(first, last int, a retryhttp.Attempt) int {
	best, bestAlive, bestOrder := -1, false, 0
	for i := first; i <= last; i++ {
		as := st.spans[i]
		if as == nil || as.answered == 0 {
			continue
		}
		if a.Err != nil {
			if sameError(as.err, a.Err) || as.err == nil && as.status == 0 { // the Transport's error for neither
				return i
			}
			continue
		}
		if as.err != nil || as.status != a.Status {
			continue
		}
		alive := as.ctx.Err() == nil
		if best < 0 || alive && !bestAlive || alive == bestAlive && as.answered > bestOrder {
			best, bestAlive, bestOrder = i, alive, as.answered
		}
	}
	return best
}

// sameError reports whether a and b are the same error value, without
// the panic == gives on an uncomparable one.
func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == b
	}
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// ended records how the request ended on its span: the decision, and the
// attempts made. An *Error holds them; after a response, the last
// attempt's decision stands.
func (st *request) ended(err error) {
	st.mu.Lock()
	d, n := st.last, st.decided
	st.mu.Unlock()
	var re *retryhttp.Error
	if errors.As(err, &re) {
		d, n = re.Decision, re.Attempts
	} else if err != nil {
		return
	}
	st.span.SetAttributes(keyDecision.String(d.String()), keyAttempts.Int(n))
}

// close ends the request's own span, if it started one, and the spans of
// attempts no hook decided (a hook panicked).
func (st *request) close(own trace.Span) {
	st.mu.Lock()
	for _, as := range st.spans {
		if as == nil || as.ended {
			continue
		}
		as.decided = true
		if as.answered > 0 {
			as.endAlone()
		}
	}
	st.mu.Unlock()
	if own != nil {
		own.End()
	}
}

// urlAttrs are the attributes of req's destination: its method, its URL
// redacted as the Transport's Logger redacts it, its server's address
// and port.
func urlAttrs(req *http.Request) []attribute.KeyValue {
	m := method(req)
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(m)}
	if !knownMethod(m) {
		attrs = []attribute.KeyValue{semconv.HTTPRequestMethodKey.String("_OTHER"), semconv.HTTPRequestMethodOriginal(m)}
	}
	u := req.URL
	if u == nil {
		return attrs
	}
	attrs = append(attrs, semconv.URLFull(redactURL(u)))
	host, port := u.Hostname(), u.Port()
	if host == "" {
		return attrs
	}
	attrs = append(attrs, semconv.ServerAddress(host))
	if port == "" {
		switch u.Scheme {
		case "http":
			port = "80"
		case "https":
			port = "443"
		}
	}
	if p, err := strconv.Atoi(port); err == nil {
		attrs = append(attrs, semconv.ServerPort(p))
	}
	return attrs
}

// redactURL renders u as the Transport's Logger does: scheme, host and
// path, without user info, query or fragment.
func redactURL(u *url.URL) string {
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return r.String()
}

func method(r *http.Request) string {
	if r.Method == "" {
		return http.MethodGet
	}
	return r.Method
}

// spanName is an attempt's span name: its method, or HTTP for a method
// the conventions do not know.
func spanName(r *http.Request) string {
	if m := method(r); knownMethod(m) {
		return m
	}
	return "HTTP"
}

// knownMethod reports whether m is one of the HTTP conventions' methods.
func knownMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodDelete,
		http.MethodConnect, http.MethodOptions, http.MethodTrace, http.MethodPatch:
		return true
	}
	return false
}

// errorType is the error.type of err: timeout, canceled, rate_limited, or
// the type of the cause, below a *retryhttp.Error and a *url.Error.
func errorType(err error) attribute.KeyValue {
	var ne net.Error
	switch {
	case errors.Is(err, retryhttp.ErrRateLimited):
		return semconv.ErrorTypeKey.String("rate_limited")
	case errors.Is(err, retryhttp.ErrAttemptTimeout), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout():
		return semconv.ErrorTypeKey.String("timeout")
	case errors.Is(err, context.Canceled):
		return semconv.ErrorTypeKey.String("canceled")
	}
	var re *retryhttp.Error
	if errors.As(err, &re) && re.Err != nil {
		err = re.Err // the cause
	}
	var ue *url.Error
	if errors.As(err, &ue) && ue.Err != nil {
		err = ue.Err
	}
	return semconv.ErrorType(err)
}

// errText is the attempt's error as the Transport logs it: the secrets
// of any URL in it left out.
func errText(a retryhttp.Attempt) string {
	for _, attr := range a.LogValue().Group() {
		if attr.Key == "error" {
			return attr.Value.String()
		}
	}
	return ""
}
