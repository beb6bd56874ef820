package retryhttp

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A Decision is what the Transport did after an attempt.
type Decision uint8

const (
	// Done: the outcome was Success or Permanent and is returned as it is.
	Done Decision = iota
	// Retry: another attempt follows after Attempt.Delay.
	Retry
	// StopAttempts: the outcome was retryable but Policy.MaxAttempts were
	// made.
	StopAttempts
	// StopBudget: the Budget could not pay for the retry.
	StopBudget
	// StopDeadline: the wait would not end before the deadline (the request
	// context's or Policy.Timeout's). With Policy.PropagateDeadline, also
	// an attempt, the first included, that the measured latency says could
	// not end before it.
	StopDeadline
	// StopServerDelay: the server asked for a wait longer than
	// Policy.MaxServerDelay.
	StopServerDelay
	// StopNotReplayable: the request body cannot be sent again (no GetBody,
	// or GetBody failed).
	StopNotReplayable
	// StopNotIdempotent: a POST or PATCH without an idempotency key, after a
	// failure that does not prove the request was never sent.
	StopNotIdempotent
	// StopCanceled: the request's context ended, during an attempt or a wait.
	StopCanceled
	// StopDownstream: the response said that retrying was already done and
	// used up further down (exhaustedHeader, or another system's "do not
	// retry" signal). It is returned at once, at no cost to the Budget.
	StopDownstream
	// StopRateLimited: the Transport's Limiter could give the next attempt
	// no send permit in time (see ErrRateLimited).
	StopRateLimited
)

func (d Decision) String() string {
	switch d {
	case Done:
		return "done"
	case Retry:
		return "retry"
	case StopAttempts:
		return "attempts exhausted"
	case StopBudget:
		return "retry budget exhausted"
	case StopDeadline:
		return "deadline too close"
	case StopServerDelay:
		return "server delay too long"
	case StopNotReplayable:
		return "body not replayable"
	case StopNotIdempotent:
		return "not idempotent"
	case StopCanceled:
		return "canceled"
	case StopDownstream:
		return "retried downstream"
	case StopRateLimited:
		return "rate limited"
	}
	return "decision(" + itoa(int(d)) + ")"
}

// An Attempt is what happened to one attempt, and what the Transport
// decided after it. Transport.OnAttempt receives it, and a Report lists
// it.
type Attempt struct {
	// Request is the request this attempt sent, idempotency key included.
	// Read it; do not modify it or read its body.
	Request *http.Request
	// Number counts attempts from 1.
	Number int
	// Status is the response's status code, 0 when Err is set.
	Status int
	// Err is the attempt's error, nil when a response arrived.
	Err error
	// Class is how the Policy classified the outcome.
	Class Class
	// Retrying is the class of the failure this attempt retries. It is
	// Success for a request's first attempt.
	Retrying Class
	// Decision is what happens next. A Retry can still end in its wait:
	// the context ends, or the Limiter has no permit.
	Decision Decision
	// Delay is the wait before the next attempt when Decision is Retry.
	// For StopDeadline and StopServerDelay, it is the wait refused.
	Delay time.Duration
	// ServerDelay reports that the response asked for Delay (Retry-After
	// and kin). Otherwise the backoff schedule chose it.
	ServerDelay bool
	// Duration is how long the attempt took, up to its response headers or
	// its error.
	Duration time.Duration
	// Hedges is how many hedged copies of this attempt were sent. They
	// count as attempts, numbered after this one.
	Hedges int
	// HedgeWon reports that a hedged copy's answer is this attempt's
	// outcome.
	HedgeWon bool
	// HedgesRefused is how many times a hedge was due and not sent: the
	// hedge share held none, or the Limiter had no permit.
	HedgesRefused int
	// PermitWait is how long this attempt waited for a send permit from
	// the Limiter, beyond any backoff.
	PermitWait time.Duration

	url       *url.URL // with Err, a copy of Request.URL as sent, for its text
	tokens    int      // what the budget held after the decision, for the text
	rateLimit float64  // the Limiter's rate after the decision, for the log
	// budgetFallback reports that a shared budget paid from its local
	// fallback: it has a method Fallback() (bool, error) that says so.
	budgetFallback bool
}

// A Report is how one request ended: the per-request view, as
// net/http/httptrace gives one for connections. Transport.OnEnd receives
// one as RoundTrip returns. A Report attached with WithReport is filled
// with the same, and lists the attempts. An *Error holds its request's.
//
//	var rep retryhttp.Report
//	req = req.WithContext(retryhttp.WithReport(req.Context(), &rep))
//	resp, err := client.Do(req)
//	if rep.Decision == retryhttp.StopBudget {
//		// the budget cut retries short, whether a 503 or an error came back
//	}
//
// A 503 returned after retries carries a nil error, so only the Report
// says why retrying stopped.
type Report struct {
	// Attempts is the number of attempts made, hedged copies included.
	Attempts int
	// Decision is Done when the last outcome is returned as it is: a
	// success, or a failure that is not retryable. Otherwise it says why
	// no further attempt was made.
	Decision Decision
	// Abandoned reports that the request ended before an attempt it was
	// going to make. Its context ended (StopCanceled), or the Limiter had
	// no permit (StopRateLimited). With Attempts not 0, the last Attempt
	// said Retry, and the retry was never sent.
	Abandoned bool
	// Err is the cause of the error returned, nil with a response.
	Err error
	// Duration is how long RoundTrip took, up to the response headers it
	// returns or its error.
	Duration time.Duration
	// History lists every attempt, in order. Only a Report attached with
	// WithReport holds it.
	History []Attempt
}

// String renders the attempt for humans, with the URL stripped of user info,
// query and fragment and no header at all, so that printing an Attempt with
// %v never leaks a credential.
func (a Attempt) String() string {
	var b strings.Builder
	b.WriteString("attempt ")
	b.WriteString(itoa(a.Number))
	if a.Request != nil {
		b.WriteString(" " + method(a.Request) + " " + redactURL(a.Request.URL))
	}
	b.WriteString(": ")
	if a.Err != nil {
		b.WriteString(errStringFor(a.Err, a.sentURL()))
	} else {
		b.WriteString(itoa(a.Status))
	}
	b.WriteString(" " + a.Class.String() + " -> " + a.Decision.String())
	if a.Decision == Retry {
		b.WriteString(" in " + a.Delay.String() + " (" + a.delaySource() + ")")
	}
	b.WriteString(", " + itoa(a.tokens) + " tokens")
	if a.budgetFallback {
		b.WriteString(" (budget fallback)")
	}
	return b.String()
}

// LogValue renders the attempt for log/slog with the same care as String.
func (a Attempt) LogValue() slog.Value {
	return slog.GroupValue(a.attrs()...)
}

func (a Attempt) attrs() []slog.Attr {
	attrs := make([]slog.Attr, 0, 12)
	if a.Request != nil {
		attrs = append(attrs,
			slog.String("method", method(a.Request)),
			slog.String("url", redactURL(a.Request.URL)))
	}
	attrs = append(attrs,
		slog.Int("attempt", a.Number),
		slog.String("class", a.Class.String()),
		slog.String("decision", a.Decision.String()))
	if a.Err != nil {
		attrs = append(attrs, slog.String("error", errStringFor(a.Err, a.sentURL())))
	} else {
		attrs = append(attrs, slog.Int("status", a.Status))
	}
	if a.Decision == Retry || a.Decision == StopDeadline || a.Decision == StopServerDelay {
		attrs = append(attrs, slog.Duration("delay", a.Delay), slog.String("delay_source", a.delaySource()))
	}
	if a.budgetFallback {
		attrs = append(attrs, slog.Bool("budget_fallback", true))
	}
	if a.rateLimit > 0 {
		attrs = append(attrs, slog.Float64("rate_limit", a.rateLimit))
	}
	if a.PermitWait > 0 {
		attrs = append(attrs, slog.Duration("permit_wait", a.PermitWait))
	}
	return append(attrs, slog.Int("tokens", a.tokens))
}

// delaySource names where Delay came from, in text and logs.
func (a Attempt) delaySource() string {
	if a.ServerDelay {
		return "server"
	}
	return "backoff"
}

// Error is the error RoundTrip returns when it ends on an error rather
// than a response. Its Report says how the request ended. It wraps the
// cause, Report.Err, so that errors.Is and errors.As reach it. When the
// context ended during a wait, the cause wraps the context's error too.
type Error struct {
	Report

	url *url.URL // a copy of the request's, whose secrets stay out of the text
}

func (e *Error) Error() string {
	why := e.Decision.String()
	if e.Decision == Done {
		why = "not retryable"
	}
	cause := strings.ReplaceAll(errStringFor(e.Err, e.url), prefix, "") // one prefix, this one
	return prefix + why + " after " + plural(e.Attempts, "attempt") + ": " + cause
}

// prefix starts the text of every error of this package. An *Error's text
// has it once: the causes it wraps, this package's own among them, lose
// theirs there.
const prefix = "retryhttp: "

func (e *Error) Unwrap() error { return e.Err }

// Timeout reports whether the request failed because time ran out: the
// caller's deadline, Policy.Timeout, or an attempt that timed out and was
// not followed by a success. (*url.Error).Timeout reads it, so that an
// http.Client's error reports a timeout where the base's would.
func (e *Error) Timeout() bool {
	return errors.Is(e.Err, ErrAttemptTimeout) || anyTimeout(e.Err)
}

func plural(n int, s string) string {
	if n == 1 {
		return "1 " + s
	}
	return itoa(n) + " " + s + "s"
}

// errString renders err without the query, fragment or user info of any
// URL it carries. The text of each *url.Error in its chain is replaced by a
// redacted one, and whatever wraps it is kept. A wrapper may still print a
// secret of one of their URLs. The text is then the first url.Error's,
// redacted, alone.
func errString(err error) string {
	if err == nil {
		return "<nil>"
	}
	var ue *url.Error
	if !errors.As(err, &ue) {
		return err.Error()
	}
	if err == error(ue) {
		return redactURLError(ue)
	}
	full := err.Error()
	var secrets []string
	walkChain(err, func(e error) bool {
		if u, ok := e.(*url.Error); ok {
			full = strings.ReplaceAll(full, u.Error(), redactURLError(u))
			secrets = append(secrets, urlSecrets(u.URL, minSecret)...)
		}
		return false
	})
	for _, s := range secrets {
		if strings.Contains(full, s) {
			return redactURLError(ue)
		}
	}
	return full
}

// errStringFor renders err as errString does. It also keeps the secrets of
// u, the URL of the request err came from, out of text that names it other
// than in a *url.Error: a base's own message ("GET <url> giving up"), or a
// wrapper's. The URL is shown redacted, and each secret left elsewhere in
// the text is replaced. A secret is left when it is too short to tell from
// the text's own words: under minSecret bytes, or under minReplaced for a
// query value alone. It is left when the redacted URL shows it anyway.
func errStringFor(err error, u *url.URL) string {
	s := errString(err)
	if u == nil || u.User == nil && u.RawQuery == "" && u.Fragment == "" {
		return s
	}
	raw, shown := u.String(), redactURL(u)
	s = strings.ReplaceAll(s, raw, shown)
	secrets := urlSecrets(raw, minReplaced)
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) }) // a secret may hold another
	for _, secret := range secrets {
		if len(secret) >= minSecret && !strings.Contains(shown, secret) {
			s = strings.ReplaceAll(s, secret, "[redacted]")
		}
	}
	return s
}

// minReplaced is the shortest query value errStringFor replaces on its own
// wherever it appears. A shorter one (a state, a region, a page number)
// would take words out of the message, and is rarely a credential. The
// query as a whole is replaced from minSecret bytes.
const minReplaced = 8

// sentURL is the URL the attempt was sent to: the copy taken with its
// error, or Request's, or nil.
func (a Attempt) sentURL() *url.URL {
	if a.url != nil {
		return a.url
	}
	if a.Request != nil {
		return a.Request.URL
	}
	return nil
}

// urlCopy returns a copy of u (nil for nil): what the caller does with its
// request once RoundTrip has returned, as it may, then neither changes nor
// races what an error says.
func urlCopy(u *url.URL) *url.URL {
	if u == nil {
		return nil
	}
	c := *u
	return &c
}

// minSecret is the shortest query value urlSecrets counts as a secret. A
// shorter one (a page number, a flag) would be found in any text, and keep
// what wraps a url.Error out of it for nothing.
const minSecret = 4

// urlSecrets lists what redactURL leaves out of raw: its user info (and
// password), query and fragment, and the values in them of minValue bytes
// or more, or raw itself if it does not parse.
func urlSecrets(raw string, minValue int) []string {
	u, err := url.Parse(raw)
	if err != nil {
		return []string{raw}
	}
	var s []string
	if u.User != nil {
		s = append(s, u.User.String())
		if p, ok := u.User.Password(); ok && p != "" {
			s = append(s, p)
		} else if n := u.User.Username(); n != "" {
			s = append(s, n) // an API key's URL (https://KEY:@host) has no other secret
		}
	}
	for _, part := range []string{u.RawQuery, u.Fragment, u.EscapedFragment()} {
		if part != "" {
			s = append(s, part)
		}
	}
	// A wrapper may print part of the query (or of a fragment that holds
	// parameters, as OAuth's does), or print it decoded: every value is a
	// secret, raw and escaped.
	for _, part := range []string{u.RawQuery, u.EscapedFragment()} {
		if part == "" {
			continue
		}
		if q, err := url.QueryUnescape(part); err == nil && q != part {
			s = append(s, q)
		}
		vals, _ := url.ParseQuery(part) // what parses, on an error too
		for _, vs := range vals {
			for _, v := range vs {
				if len(v) >= minValue {
					s = append(s, v, url.QueryEscape(v))
				}
			}
		}
	}
	return s
}

// redactURLError renders a *url.Error as errString does.
func redactURLError(ue *url.Error) string {
	u, perr := url.Parse(ue.URL)
	if perr != nil {
		return ue.Op + " <invalid URL>: " + errString(ue.Err)
	}
	return ue.Op + " " + redactURL(u) + ": " + errString(ue.Err)
}

// redactURL renders u without user info, query or fragment: what may go into
// logs and errors.
func redactURL(u *url.URL) string {
	if u == nil {
		return ""
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return r.String()
}

// log writes one line for a retry decision: every attempt whose outcome was
// retryable, and the Done of an attempt that followed a retry.
func (t *Transport) log(ctx context.Context, a Attempt) {
	if a.Decision == Done && a.Number == 1 {
		return
	}
	level := slog.LevelInfo
	msg := "retryhttp: retrying"
	switch a.Decision {
	case Retry:
	case Done:
		msg = "retryhttp: done after retry"
	default:
		level, msg = slog.LevelWarn, "retryhttp: giving up"
	}
	if !t.Logger.Enabled(ctx, level) {
		return
	}
	t.Logger.LogAttrs(ctx, level, msg, a.attrs()...)
}

func method(r *http.Request) string {
	if r.Method == "" {
		return http.MethodGet
	}
	return r.Method
}

// observe passes a to the hook, the log and the request's Report.
func (t *Transport) observe(ctx context.Context, report *Report, budget Budget, a Attempt, resp *http.Response) {
	if resp != nil {
		a.Status = resp.StatusCode
	}
	if f, ok := budget.(interface{ Fallback() (bool, error) }); ok {
		a.budgetFallback, _ = f.Fallback()
	}
	report.add(a)
	if t.OnAttempt != nil {
		t.OnAttempt(a)
	}
	if t.Logger != nil && (a.Class.retryable() || a.Number > 1) {
		t.log(ctx, a)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }
