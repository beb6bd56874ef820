package retryhttp

import (
	"context"
)

// WithReport returns a copy of ctx that makes every Transport the request
// goes through fill r. Read r once RoundTrip (or http.Client.Do) has
// returned: the Transport fills it on the goroutine that calls RoundTrip.
// A Report must not be shared by requests in flight at the same time.
//
// Redirects followed by an http.Client are further round trips with the
// same context. Their attempts are appended to History, and the other
// fields are the last round trip's. A request without a Report costs the
// Transport one context lookup. An Override attached to ctx stays
// attached.
//
// A hedged copy's attempts in the Transports below join History when the
// copy answers before its race ends. A copy still running then leaves them
// out.
func WithReport(ctx context.Context, r *Report) context.Context {
	v := requestFrom(ctx)
	return withRequest(ctx, &request{report: r, override: v.override})
}

// The methods below accept a nil Report, so that RoundTrip calls them
// without checking.

func (r *Report) add(a Attempt) {
	if r != nil {
		r.History = append(r.History, a)
	}
}

// end records how the request ended, keeping History.
func (r *Report) end(e Report) {
	if r != nil {
		e.History = r.History
		*r = e
	}
}

// merge appends what a hedged copy's own Report recorded, for a copy that
// answered before its race ended.
func (r *Report) merge(from *Report) {
	if r != nil && from != nil {
		r.History = append(r.History, from.History...)
	}
}
