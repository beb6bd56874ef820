package retryhttp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Retries multiply through layers: k services that each make 3 attempts
// send 3^k to the bottom. The Google SRE book's rule is that only the layer
// directly above the failing dependency retries. The layers further up
// return the error at once, told by a signal on the wire. This file is that
// signal. Handler adds it to a service's error responses when its own calls
// used up their retries. The Transport does not retry a response with it.

// exhaustedHeader is the response header that says "retries for this request
// were already made, and used up, further down: do not retry it". Its value
// names the reason: "attempts", "budget", "server-delay", "downstream" or
// "rate-limited".
// Handler adds it; the Transport stops on it (StopDownstream).
//
// The Transport also honours the signals other systems put on the wire for
// the same meaning: Finagle's "finagle-http-nonretryable-nack" header, and
// gRPC's "grpc-retry-pushback-ms" with a negative or malformed value.
const exhaustedHeader = "Retries-Exhausted"

// Headers of other systems that mean "do not retry this response".
const (
	finagleNonRetryableNack = "Finagle-Http-Nonretryable-Nack"
	grpcRetryPushback       = "Grpc-Retry-Pushback-Ms"
	stripeShouldRetry       = "Stripe-Should-Retry"
)

// noRetrySignal reports whether h carries a "do not retry" signal: ours,
// Finagle's non-retryable nack, a gRPC pushback that refuses retries, or
// Stripe's "Stripe-Should-Retry: false" (stripe-go stops on it).
func noRetrySignal(h http.Header) bool {
	if len(h[exhaustedHeader]) > 0 || len(h[finagleNonRetryableNack]) > 0 {
		return true
	}
	if vs := h[stripeShouldRetry]; len(vs) > 0 && strings.EqualFold(strings.TrimSpace(vs[0]), "false") {
		return true
	}
	if vs := h[grpcRetryPushback]; len(vs) > 0 {
		// gRPC (A6, retry design): a non-negative integer is a delay in
		// milliseconds; anything else means "do not retry", several
		// values included, as grpc-go reads them.
		if len(vs) > 1 {
			return true
		}
		ms, err := strconv.ParseInt(strings.TrimSpace(vs[0]), 10, 64)
		return err != nil || ms < 0
	}
	return false
}

// exhaustedReason returns the exhaustedHeader value for a final decision
// that ended retrying because retries were used up or refused. It returns
// "" for any other: a request that succeeded, failed permanently, was
// canceled, or made only its one allowed attempt. A layer with MaxAttempts
// 1 retries nothing, so the layer above it may.
func exhaustedReason(d Decision, maxAttempts int) string {
	switch d {
	case StopAttempts:
		if maxAttempts > 1 {
			return "attempts"
		}
	case StopBudget:
		return "budget"
	case StopServerDelay:
		return "server-delay"
	case StopDownstream:
		return "downstream"
	case StopRateLimited:
		return "rate-limited"
	}
	return ""
}

// attemptHeader is the request header that carries the attempt number,
// 1 for the first, when Policy.SendAttemptHeader is set.
const attemptHeader = "Retry-Attempt"

// requestAttempt reports which attempt of its client the inbound request r
// is, from attemptHeader, Envoy's x-envoy-attempt-count or the AWS SDKs'
// amz-sdk-request (attempt=N): 1 is a first attempt, more is a retry. It
// returns 0 when the request carries none of them.
func requestAttempt(r *http.Request) int {
	for _, name := range []string{attemptHeader, "X-Envoy-Attempt-Count"} {
		if v := r.Header.Get(name); v != "" {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
				return n
			}
		}
	}
	if v := r.Header.Get("Amz-Sdk-Request"); v != "" {
		for part := range strings.SplitSeq(v, ";") {
			k, val, ok := strings.Cut(strings.TrimSpace(part), "=")
			if ok && k == "attempt" {
				if n, err := strconv.Atoi(val); err == nil && n > 0 {
					return n
				}
			}
		}
	}
	return 0
}

// timeLeftHeader is the request header that carries the time the caller
// gives the request, in whole milliseconds, when Policy.PropagateDeadline is
// set: Envoy's x-envoy-expected-rq-timeout-ms format under a name of this
// package's own (docs/design.md gives the choice).
const timeLeftHeader = "Request-Timeout-Ms"

// replyMargin is the time Handler keeps for the answer's way back. The
// request is served under the deadline its caller sent, less replyMargin.
// An answer made at the last moment then still reaches the caller in time.
// The Google SRE book ("Handling Overload") cuts the outgoing deadline a
// little for transit and post-processing.
const replyMargin = 5 * time.Millisecond

// maxInboundTimeout is the longest deadline Handler takes from a request
// that has none yet: a larger value in timeLeftHeader is clamped to it.
const maxInboundTimeout = 5 * time.Minute

// withTimeLeft returns a copy of out whose header says it has left, in whole
// milliseconds, rounded down (no less than 0).
func withTimeLeft(out *http.Request, left time.Duration) *http.Request {
	r := shallowCopy(out)
	r.Header = cloneHeaderWith(out.Header, timeLeftHeader, strconv.FormatInt(max(left.Milliseconds(), 0), 10), nil)
	return r
}

// inboundDeadline returns the deadline, less replyMargin, that the values
// vs of timeLeftHeader give a request arriving now with context ctx. It
// reports false when they give none. That is a value that is not one run
// of ASCII digits, several values, or a deadline no sooner than ctx's. A
// value longer than maxInboundTimeout is clamped to it.
func inboundDeadline(ctx context.Context, vs []string, now time.Time) (time.Time, bool) {
	if len(vs) != 1 || vs[0] == "" {
		return time.Time{}, false
	}
	const maxMs = int64(math.MaxInt64 / time.Millisecond / 10)
	var ms int64
	for i := 0; i < len(vs[0]); i++ {
		d := vs[0][i]
		if d < '0' || d > '9' {
			return time.Time{}, false
		}
		ms = min(ms*10+int64(d-'0'), maxMs) // saturates: no overflow
	}
	timeout := time.Duration(ms)*time.Millisecond - replyMargin
	old, ok := ctx.Deadline()
	if !ok {
		return now.Add(min(timeout, maxInboundTimeout)), true
	}
	if deadline := now.Add(timeout); deadline.Before(old) {
		return deadline, true
	}
	return time.Time{}, false
}

// Handler wraps a service's handler so that its error responses tell the
// layer above not to retry, when retrying was already done below. It also
// gives the request the deadline its caller sent.
//
// While next handles a request, every Transport call made with the
// request's context, or one derived from it, reports how it ended. One may
// end with its retries used up or refused: attempts exhausted, the budget
// empty, a server delay too long, or a downstream response with the signal.
// A 5xx or 429 response that next then writes carries a Retries-Exhausted
// header, whose value names the reason. Every Transport above stops on it.
// A response written for any other reason carries nothing: if the service
// fails on its own, the layer above should retry. A 2xx, 3xx or other 4xx
// never carries it.
//
// The ResponseWriter that next sees keeps http.Flusher and http.Hijacker.
// It passes on the flush errors of the writer below, as
// http.ResponseController reads them, and unwraps for its other methods. A
// request costs two allocations; nothing else happens unless a call fails.
//
// A Transport with Policy.PropagateDeadline sends a Request-Timeout-Ms
// header. A request with one is served under that deadline, less 5ms for
// the answer's way back. The service's own Transport and database calls
// see it, and stop when its caller would stop waiting. The header is a
// count of milliseconds. Any other value, or several, is ignored, never an
// error to the client. A deadline the request already has is never
// extended: http.TimeoutHandler's, or its server's BaseContext's. Without
// one, the ceiling is 5 minutes. The header stays on the request, so that
// a proxy passes it on. Such a request costs a timer and its context more.
func Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lw := &layerWriter{rw: w}
		ctx := r.Context()
		if vs := r.Header[timeLeftHeader]; len(vs) > 0 {
			if deadline, ok := inboundDeadline(ctx, vs, time.Now()); ok {
				var cancel context.CancelFunc
				ctx, cancel = context.WithDeadline(ctx, deadline)
				defer cancel()
			}
		}
		lw.ctx.Context = ctx
		next.ServeHTTP(lw, r.WithContext(&lw.ctx))
	})
}

// layerState is what a Handler learns from the calls made under it.
type layerState struct {
	exhausted atomic.Pointer[string] // the first reason seen
}

func (s *layerState) markExhausted(reason string) {
	s.exhausted.CompareAndSwap(nil, &reason)
}

// layerContext is the inbound request's context with the Handler's state
// attached, in one allocation with the writer.
type layerContext struct {
	context.Context
	state layerState
}

type layerKey struct{}

func (c *layerContext) Value(key any) any {
	if key == (layerKey{}) {
		return &c.state
	}
	return c.Context.Value(key)
}

// layerFrom returns the state of the Handler serving the request that ctx
// belongs to, or nil.
func layerFrom(ctx context.Context) *layerState {
	s, _ := ctx.Value(layerKey{}).(*layerState)
	return s
}

// markLayer tells the Handler serving the request that ctx belongs to, if
// any, that this call ended with its retries used up or refused.
func markLayer(ctx context.Context, d Decision, maxAttempts int) {
	if reason := exhaustedReason(d, maxAttempts); reason != "" {
		if s := layerFrom(ctx); s != nil {
			s.markExhausted(reason)
		}
	}
}

// withAttemptHeader returns a copy of out whose header carries the attempt
// number n.
func withAttemptHeader(out *http.Request, n int) *http.Request {
	r := shallowCopy(out)
	r.Header = cloneHeaderWith(out.Header, attemptHeader, itoa(n), nil)
	return r
}

// layerWriter adds the signal to an error response when the state says so.
// It holds the request's new context, so that one allocation serves both.
type layerWriter struct {
	ctx         layerContext
	rw          http.ResponseWriter
	wroteHeader bool
}

func (w *layerWriter) Header() http.Header { return w.rw.Header() }

func (w *layerWriter) WriteHeader(code int) {
	if !w.wroteHeader && code >= 200 {
		w.wroteHeader = true
		if code >= 500 || code == http.StatusTooManyRequests {
			if reason := w.ctx.state.exhausted.Load(); reason != nil {
				w.rw.Header().Set(exhaustedHeader, *reason)
			}
		}
	}
	w.rw.WriteHeader(code)
}

func (w *layerWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.wroteHeader = true // an implicit 200: no signal
	}
	return w.rw.Write(b)
}

// ReadFrom keeps the underlying writer's io.ReaderFrom (sendfile for files).
func (w *layerWriter) ReadFrom(r io.Reader) (int64, error) {
	if !w.wroteHeader {
		w.wroteHeader = true
	}
	if rf, ok := w.rw.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w.rw}, r)
}

// FlushError flushes the underlying writer and returns its error:
// http.ErrNotSupported when it cannot flush. http.ResponseController's
// Flush calls it.
func (w *layerWriter) FlushError() error {
	err := http.NewResponseController(w.rw).Flush()
	if !errors.Is(err, http.ErrNotSupported) {
		w.wroteHeader = true // a flush writes an implicit 200
	}
	return err
}

// Flush implements http.Flusher; it does nothing when the underlying writer
// cannot flush. Use http.ResponseController to see errors.
func (w *layerWriter) Flush() { w.FlushError() }

// Hijack implements http.Hijacker when the underlying writer can hijack.
func (w *layerWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(w.rw).Hijack()
}

// Unwrap gives http.ResponseController the underlying writer.
func (w *layerWriter) Unwrap() http.ResponseWriter { return w.rw }

var (
	_ http.Flusher    = (*layerWriter)(nil)
	_ http.Hijacker   = (*layerWriter)(nil)
	_ context.Context = (*layerContext)(nil)
)
