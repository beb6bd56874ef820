package retryhttp

import (
	"context"
	"time"
)

// A Report records what a Transport did for one request: every attempt with
// its outcome and the decision after it, the time spent waiting between
// attempts, and the final decision. It is the per-request view, as
// net/http/httptrace gives one for connections: attach it to the request's
// context with WithReport, send the request, then read it.
//
//	var rep retryhttp.Report
//	req = req.WithContext(retryhttp.WithReport(req.Context(), &rep))
//	resp, err := client.Do(req)
//	if rep.Decision == retryhttp.StopBudget {
//		// retries were cut short by the budget, whether a 503 or an
//		// error came back
//	}
//
// This matters most when a response comes back: a 503 returned after
// retries carries a nil error, so only the Report says why retrying
// stopped. A request without a Report costs the Transport one context
// lookup.
//
// The Transport fills the Report on the goroutine that calls RoundTrip;
// read it once RoundTrip (or http.Client.Do) has returned. A hedged copy's
// attempts in the Transports below join it when the copy answers before
// its race ends; a copy canceled while still running leaves them out. Redirects
// followed by an http.Client are further round trips with the same context:
// their attempts are appended and Decision is the last one's. A Report must
// not be shared by requests in flight at the same time.
type Report struct {
	// Attempts lists every attempt made, in order, as Transport.OnAttempt
	// sees them.
	Attempts []Attempt
	// Decision is what ended the last round trip: Done for a Success or
	// Permanent outcome, a Stop decision when a retryable outcome was not
	// retried (StopCanceled also when the context ended during a wait).
	Decision Decision
	// Waited is the total of the waits between attempts that were made.
	Waited time.Duration
}

// Retries reports how many attempts after the first the Report holds.
func (r *Report) Retries() int { return max(len(r.Attempts)-1, 0) }

// WithReport returns a copy of ctx that makes every Transport the request
// goes through record what it did in r. An Override attached to ctx stays
// attached.
func WithReport(ctx context.Context, r *Report) context.Context {
	v := requestFrom(ctx)
	return withRequest(ctx, &request{report: r, override: v.override})
}

// The methods below accept a nil Report, so that RoundTrip calls them
// without checking.

func (r *Report) add(a Attempt) {
	if r != nil {
		r.Attempts = append(r.Attempts, a)
	}
}

func (r *Report) finish(d Decision) {
	if r != nil {
		r.Decision = d
	}
}

func (r *Report) waited(d time.Duration) {
	if r != nil {
		r.Waited += d
	}
}

// merge appends what a hedged copy's own Report recorded, for a copy that
// answered before its race ended.
func (r *Report) merge(from *Report) {
	if r != nil && from != nil {
		r.Attempts = append(r.Attempts, from.Attempts...)
		r.Waited += from.Waited
	}
}
