package retryhttp

import (
	"context"
	"time"
)

// An Override changes how the Transport treats one request, without a
// second client. A call that must not be retried sets MaxAttempts to 1.
// Attach it to the request's context with WithOverride, as
// net/http/httptrace attaches a ClientTrace.
//
// A field left zero keeps the Transport's Policy. The Override never wins
// over what the Transport shares. Every retry is still paid from the
// budget, and every attempt still waits for its send permit.
type Override struct {
	// MaxAttempts, if positive, replaces Policy.MaxAttempts.
	MaxAttempts int
	// Timeout, if positive, replaces Policy.Timeout.
	Timeout time.Duration
	// AttemptTimeout, if positive, replaces Policy.AttemptTimeout.
	AttemptTimeout time.Duration
}

// WithOverride returns a copy of ctx that makes every Transport the request
// goes through apply o to it. A Report attached to ctx stays attached.
func WithOverride(ctx context.Context, o Override) context.Context {
	v := requestFrom(ctx)
	return withRequest(ctx, &request{report: v.report, override: &o})
}

// request is what a request's context carries for the Transport: one
// value, found with one lookup, however many of its parts are set.
type request struct {
	report   *Report
	override *Override
}

type requestKey struct{}

func withRequest(ctx context.Context, r *request) context.Context {
	return context.WithValue(ctx, requestKey{}, r)
}

// requestFrom returns what ctx carries for the Transport; its fields are
// nil when nothing is attached.
func requestFrom(ctx context.Context) request {
	if r, _ := ctx.Value(requestKey{}).(*request); r != nil {
		return *r
	}
	return request{}
}

// reportFrom returns the Report attached to ctx, or nil.
func reportFrom(ctx context.Context) *Report { return requestFrom(ctx).report }

// apply returns the attempts and the Timeout of a request under o, given
// the Policy's.
func (o *Override) apply(maxAttempts int, timeout time.Duration) (int, time.Duration) {
	if o.MaxAttempts > 0 {
		maxAttempts = o.MaxAttempts
	}
	if o.Timeout > 0 {
		timeout = o.Timeout
	}
	return maxAttempts, timeout
}
