// Package retryhttp retries failed HTTP calls without making the failure
// worse.
//
// A Transport wraps any http.RoundTripper. It retries only what is worth
// retrying (502, 503 and 504, 429 as throttling, network errors before a
// response), waits with capped full-jitter exponential backoff unless the
// server asks for a delay, sends one Idempotency-Key on every attempt of a
// POST or PATCH, pays for each retry from a token Budget so that an outage
// is not multiplied by retries, and keeps every attempt and wait inside one
// deadline.
//
//	client := &http.Client{Transport: &retryhttp.Transport{}}
//
// Beyond one client, all opt-in: Handler marks a service's error responses
// when its own calls already used up their retries, so that the layers
// above do not multiply them; the Budget may be any RetryBudget (a
// RatioBudget, or one a fleet shares, as the redisbudget module's);
// Policy.HedgeDelay sends a second copy of a slow request, paid from the
// same budget; a RateLimiter slows every attempt of a client that is being
// throttled. WithReport gives a per-request view of what happened.
//
// The reasoning behind each rule, with its sources, is in docs/design.md.
package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"sync"
	"time"

	"github.com/hashicorp/go-cleanhttp"
)

// errNoResponse stands in for the error of a base that returned neither a
// response nor an error, so that RoundTrip never does the same.
var errNoResponse = errors.New("retryhttp: base RoundTripper returned neither a response nor an error")

// drainLimit bounds how much of a discarded response body is read so that its
// connection can be reused; a longer body is closed unread, which costs a new
// connection but never unbounded reading.
const drainLimit = 64 << 10

// drainTimeout bounds how long draining a discarded body may take: a body
// that stalls is closed, and the retry goes on.
const drainTimeout = 100 * time.Millisecond

// Transport is an http.RoundTripper that retries failed attempts through its
// Base according to its Policy, paying for retries from its Budget.
//
// The zero Transport is ready to use: three attempts with full-jitter
// backoff over a pooled transport of its own, with a private 500-token
// budget. A Transport is safe for concurrent use by multiple goroutines, and
// like http.Transport it should be reused rather than made per request, so
// that its budget and connections are shared. Its fields must not change
// after its first use.
//
// RoundTrip honours the http.RoundTripper contract: it never modifies the
// caller's request (an attempt that needs a change, an idempotency key or a
// fresh body from Request.GetBody, sends a copy; a bodiless request that
// needs none is sent again as it is), always closes the request body,
// replays the body only through Request.GetBody, drains (bounded in bytes
// and time) and closes every response it discards, and returns either a
// response with a nil error or an error (an *Error) with no response. A retryable response that is not
// retried (the last attempt's 503, or a 429 when the budget is empty) is
// returned as it is, with a nil error, as the base transport would.
type Transport struct {
	// Base makes each attempt. Nil means a pooled transport from
	// go-cleanhttp, made on first use and private to this Transport (never
	// http.DefaultTransport, whose settings any package may change), with
	// CheckProxyConnect as its OnProxyConnectResponse.
	Base http.RoundTripper

	// Policy decides which attempts are made and when. The zero Policy is
	// the recommended one; see Policy.
	Policy Policy

	// Budget pays for retries. Nil (or a nil *Budget) means a private
	// token bucket of DefaultBudgetTokens made on first use; give several
	// Transports the same Budget to make them share one quota. Any
	// RetryBudget will do: a *Budget, a *RatioBudget, or one shared by a
	// fleet.
	Budget RetryBudget

	// Limiter, if not nil, slows the Transport while it is being throttled:
	// every attempt, the first of a request included, waits for a send
	// permit from it, and a request whose permit would come after its
	// deadline fails at once (StopRateLimited). Give several Transports the
	// same RateLimiter to make them share one rate. Nil means no limit.
	Limiter *RateLimiter

	// OnAttempt, if not nil, is called after every attempt, once the
	// decision about it is made and before any wait, on the goroutine that
	// called RoundTrip. It must not block for long: the request waits for
	// it.
	OnAttempt func(Attempt)

	// Logger, if not nil, receives one line per retry decision: at Info for
	// a retry and for a success after retries, at Warn for giving up on a
	// retryable failure. Lines carry the method, the URL without user info
	// or query, the attempt, the status or error, the class, the decision,
	// the delay and the tokens left; never a header or a body. Nil means no
	// logging.
	Logger *slog.Logger

	once        sync.Once
	defaultBase http.RoundTripper
	inUse       RetryBudget // Budget, or a private bucket
	keys        keySource
}

func (t *Transport) init() {
	if t.Base == nil {
		base := cleanhttp.DefaultPooledTransport()
		base.OnProxyConnectResponse = CheckProxyConnect
		t.defaultBase = base
	}
	t.inUse = t.Budget
	if t.Budget == nil || isNilPointer(t.Budget) {
		t.inUse = NewBudget(DefaultBudgetTokens)
	}
}

// isNilPointer reports whether b is a nil pointer in a non-nil interface, as
// Transport{Budget: b} makes of a nil *Budget variable.
func isNilPointer(b RetryBudget) bool {
	v := reflect.ValueOf(b)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// BudgetInUse returns the budget the Transport draws from: Budget, or the
// private one it made.
func (t *Transport) BudgetInUse() RetryBudget {
	t.once.Do(t.init)
	return t.inUse
}

// CloseIdleConnections closes the idle connections of the base transport, if
// it has that method, as http.Client.CloseIdleConnections expects.
func (t *Transport) CloseIdleConnections() {
	t.once.Do(t.init)
	type closeIdler interface{ CloseIdleConnections() }
	if c, ok := t.base().(closeIdler); ok {
		c.CloseIdleConnections()
	}
}

func (t *Transport) base() http.RoundTripper {
	if t.Base != nil {
		return t.Base
	}
	return t.defaultBase
}

// RoundTrip sends req through the base transport, retrying as the Policy and
// the Budget allow. See Transport for the contract.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.once.Do(t.init)
	base := t.base()
	p := &t.Policy
	maxAttempts := p.maxAttempts()
	ctx := req.Context()
	report := reportFrom(ctx)
	if err := ctx.Err(); err != nil {
		closeBody(req.Body)
		report.finish(StopCanceled)
		return nil, &Error{Attempts: 0, Decision: StopCanceled, Err: err}
	}

	// out is the request of the current attempt. It stays the caller's own
	// request for as long as nothing about it needs to change, so a GET
	// that succeeds at once costs no copy.
	out := req
	var cancel context.CancelFunc
	if p.Timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, p.Timeout)
		out = req.WithContext(ctx)
	}
	safe := idempotentMethod(req.Method)
	if !safe && maxAttempts > 1 { // a key only matters to a retry
		name := p.idempotencyHeader()
		if _, ok := headerKey(req.Header, name); ok {
			safe = true
		} else if !p.NoIdempotencyKeys {
			out = t.withNewKey(req, out, name)
			safe = true
		}
	}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	hedge := p.hedgeable(req, safe) && maxAttempts > 1
	budget := t.inUse
	observe := t.OnAttempt != nil || t.Logger != nil || report != nil

	lim := t.Limiter
	var (
		prevDelay time.Duration
		lastCost  int64 // the tokens the retry now being made took
		start     time.Time
		resp      *http.Response
		err       error
		release   func()
		next      *http.Request
		unpaid    int64 // tokens taken for a retry not sent yet
	)
	// A hook that panics (Classify, OnAttempt, the Logger's handler, Rand,
	// GetBody) must not leave a body open, a Timeout running or a retry's
	// tokens spent. Every return sets returned, so the cleanup runs only on
	// the way out of a panic, which then goes on to the caller untouched.
	// Without any hook there is nothing to guard, and no defer to run.
	returned := false
	if p.Classify != nil || p.Rand != nil || t.OnAttempt != nil || t.Logger != nil || req.GetBody != nil {
		defer func() {
			if !returned {
				t.abandon(resp, release, cancel, next, out, unpaid)
			}
		}()
	}
	for n := 1; ; n++ {
		var (
			epoch      uint64        // of the attempt's send permit
			permitWait time.Duration // for it
		)
		if lim != nil {
			var perr error
			if epoch, permitWait, perr = lim.await(ctx); perr != nil {
				// No attempt is made: the body the base would have closed
				// is closed here, and a retry's tokens go back.
				closeBody(out.Body)
				if n > 1 {
					budget.Refund(lastCost, false)
				}
				return nil, t.stopBeforeAttempt(ctx, req, report, n-1, maxAttempts, perr, err, cancel, &returned)
			}
		}
		if observe {
			start = time.Now()
		}
		sent := out
		if p.SendAttemptHeader {
			sent = withAttemptHeader(out, n)
		}
		var (
			class Class
			hs    hedgeStats
			first = n // the number of this attempt's first copy
		)
		switch {
		case hedge:
			resp, release, err, class, hs = t.sendHedged(base, req, sent, maxAttempts-n+1, budget)
			n += hs.sent // hedges are attempts too
		case p.AttemptTimeout > 0:
			resp, release, err, class = t.sendTimed(base, sent)
		default:
			resp, err = roundTripOnce(base, sent)
			class = p.classify(resp, err)
		}

		if first == 1 {
			budget.Deposit(class == Success) // before a retry is weighed
		}
		if lim != nil && class == Throttling {
			lim.throttled(epoch, time.Now())
		}
		decision := Done
		var (
			delay time.Duration
			src   DelaySource
		)
		next = nil
		switch {
		case err != nil && ctx.Err() != nil:
			// The caller's context ended (or Policy.Timeout passed) during
			// the attempt: whatever the error says, that is why it failed.
			decision = StopCanceled
		case class.retryable():
			decision, delay, src, lastCost = t.decide(ctx, n, maxAttempts, class, resp, err, safe, replayable, prevDelay, budget)
			if decision == Retry && lim != nil && !lim.admits(ctx, delay) {
				budget.Refund(lastCost, false)
				decision = StopRateLimited
			}
			if decision == Retry {
				unpaid = lastCost
				if next = nextRequest(req, out); next == nil {
					budget.Refund(unpaid, false)
					unpaid, decision = 0, StopNotReplayable
				}
			}
		case class == Success && first > 1:
			budget.Refund(lastCost, true) // the retry that succeeded pays nothing
		}

		if observe {
			t.observe(ctx, report, Attempt{Request: sent, Number: first, Err: err, Class: class, Decision: decision,
				Delay: delay, DelaySource: src, Tokens: budget.Available(), Duration: time.Since(start),
				Hedges: hs.sent, HedgeWon: hs.won, HedgesRefused: hs.refused,
				PermitWait: permitWait, RateLimit: lim.rate()}, resp)
		}

		if decision != Retry {
			report.finish(decision)
			if decision != Done {
				markLayer(ctx, decision, maxAttempts)
			}
			returned = true
			if resp != nil {
				if release != nil || cancel != nil {
					if resp.StatusCode == http.StatusSwitchingProtocols {
						// The upgraded connection is the caller's, outside
						// the attempt's and the Timeout's reach (net/http
						// stops watching the context once it hands the
						// connection over).
						releaseAll(release, cancel)
					} else {
						resp.Body = onClose(resp.Body, release, cancel)
					}
				}
				return resp, nil
			}
			if cancel != nil {
				cancel()
			}
			return nil, &Error{Attempts: n, Decision: decision, Err: err}
		}

		wait := delay
		if delay > 0 {
			began := time.Now()
			discard(resp, release)
			wait -= time.Since(began) // the drain is part of the wait
		} else {
			discard(resp, release)
		}
		resp, release = nil, nil
		if werr := sleep(ctx, wait); werr != nil {
			// The retry is not made: its tokens go back.
			budget.Refund(unpaid, false)
			unpaid = 0
			if next != out {
				closeBody(next.Body)
			}
			return nil, t.stopBeforeAttempt(ctx, req, report, n, maxAttempts, werr, err, cancel, &returned)
		}
		report.waited(delay)
		prevDelay = delay
		out, next, unpaid = next, nil, 0
	}
}

// stopBeforeAttempt ends a RoundTrip whose next attempt will not be made:
// its context ended during a wait, or its RateLimiter has no permit for it
// (why). lastErr is the last attempt's error, if there was one.
func (t *Transport) stopBeforeAttempt(ctx context.Context, req *http.Request, report *Report, attempts, maxAttempts int, why, lastErr error,
	cancel context.CancelFunc, returned *bool,
) error {
	decision := StopCanceled
	if errors.Is(why, ErrRateLimited) {
		decision = StopRateLimited
		markLayer(ctx, decision, maxAttempts)
		if t.Logger != nil && t.Logger.Enabled(ctx, slog.LevelWarn) {
			// No attempt was made, so no hook ran: one line says why.
			t.Logger.LogAttrs(ctx, slog.LevelWarn, "retryhttp: no send permit", slog.String("method", method(req)),
				slog.String("url", redactURL(req.URL)), slog.Int("attempt", attempts+1), slog.Float64("rate_limit", t.Limiter.rate()))
		}
	}
	if cancel != nil {
		cancel()
	}
	report.finish(decision)
	*returned = true
	cause := why
	if lastErr != nil {
		cause = fmt.Errorf("%w; last attempt: %w", why, lastErr)
	}
	return &Error{Attempts: attempts, Decision: decision, Err: cause}
}

// sendTimed makes one attempt through base under Policy.AttemptTimeout and
// classifies it: the attempt has its own context and a timer that cancels
// it. The timer runs on through the classification (a Classify that peeks
// into a body that never comes is cut off with the attempt); if it fired
// first, and the request's own context is still alive, the attempt failed
// with ErrAttemptTimeout, whatever arrived. Once the timer is stopped, the
// body that is returned can be read for as long as the caller's context
// allows; release must be called once it is done with.
func (t *Transport) sendTimed(base http.RoundTripper, req *http.Request) (*http.Response, func(), error, Class) {
	p := &t.Policy
	actx, release := context.WithCancel(req.Context())
	timer := time.AfterFunc(p.AttemptTimeout, release)
	resp, err := roundTripOnce(base, req.WithContext(actx))
	class := p.classify(resp, err)
	if !timer.Stop() && req.Context().Err() == nil {
		discard(resp, release)
		err = fmt.Errorf("%w after %v", ErrAttemptTimeout, p.AttemptTimeout)
		return nil, nil, err, p.classify(nil, err)
	}
	if err != nil {
		release()
		return nil, nil, err, class
	}
	return resp, release, nil, class
}

// roundTripOnce makes one attempt through base and repairs the two ways a
// base can break the RoundTripper contract: a response together with an
// error (the response is closed and the error stands), and neither. It
// returns a response with a nil error, or an error with no response.
func roundTripOnce(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	resp, err := base.RoundTrip(req)
	if (resp == nil) == (err == nil) {
		return repair(resp, err)
	}
	return resp, err
}

// repair is roundTripOnce's answer to a base that returned both or neither.
func repair(resp *http.Response, err error) (*http.Response, error) {
	if err == nil {
		return nil, errNoResponse
	}
	closeBody(resp.Body)
	return nil, err
}

// nextRequest returns the request of the retry that follows out, or nil when
// its body cannot be had again. A request without a body is sent again as it
// is: nothing in it changes, and the base is done with it once the response
// is closed. One with a body gets a copy with a fresh body from GetBody.
func nextRequest(req, out *http.Request) *http.Request {
	if req.GetBody == nil || req.Body == nil || req.Body == http.NoBody {
		return out
	}
	body, err := req.GetBody()
	if err != nil {
		return nil
	}
	next := shallowCopy(out)
	next.Body = body
	return next
}

// observe passes a to the hook, the log and the request's Report.
func (t *Transport) observe(ctx context.Context, report *Report, a Attempt, resp *http.Response) {
	if resp != nil {
		a.Status = resp.StatusCode
	}
	if f, ok := t.inUse.(interface{ Fallback() (bool, error) }); ok {
		a.BudgetFallback, _ = f.Fallback()
	}
	report.add(a)
	if t.OnAttempt != nil {
		t.OnAttempt(a)
	}
	if t.Logger != nil && (a.Class.retryable() || a.Number > 1) {
		t.log(ctx, a)
	}
}

// abandon releases what a RoundTrip holds when a hook panics: the response
// and its attempt, the Timeout, the next attempt's body and the tokens of a
// retry that will not be made.
func (t *Transport) abandon(resp *http.Response, release func(), cancel context.CancelFunc, next, out *http.Request, unpaid int64) {
	if resp != nil {
		closeBody(resp.Body)
	}
	if release != nil {
		release()
	}
	if cancel != nil {
		cancel()
	}
	if next != nil && next != out {
		closeBody(next.Body)
	}
	if unpaid != 0 {
		t.inUse.Refund(unpaid, false)
	}
}

// decide chooses what follows a retryable outcome, and takes the retry's cost
// from the budget when it is a retry.
func (t *Transport) decide(ctx context.Context, n, maxAttempts int, class Class, resp *http.Response, err error,
	safe, replayable bool, prevDelay time.Duration, budget RetryBudget,
) (d Decision, delay time.Duration, src DelaySource, cost int64) {
	p := &t.Policy
	switch {
	case ctx.Err() != nil:
		return StopCanceled, 0, FromBackoff, 0
	case resp != nil && noRetrySignal(resp.Header):
		return StopDownstream, 0, FromBackoff, 0
	case n >= maxAttempts:
		return StopAttempts, 0, FromBackoff, 0
	case !replayable:
		return StopNotReplayable, 0, FromBackoff, 0
	case !safe && !(err != nil && neverSent(err)):
		return StopNotIdempotent, 0, FromBackoff, 0
	}

	var now time.Time // read the clock only for a date or a deadline
	deadline, hasDeadline := ctx.Deadline()
	if hasDeadline || (resp != nil && len(resp.Header[headerRetryAfter]) > 0) {
		now = time.Now()
	}
	rnd := p.rand()
	if sd, ok := serverDelay(p, resp, now); ok {
		src = FromServer
		// Up to 10% more than asked, so clients told the same number do not
		// all come back in the same instant; never less than asked. The
		// spread is at least BaseDelay, so that "Retry-After: 0" sent to a
		// crowd does not bring it back in one instant either.
		delay = sd + uniform(rnd, max(sd/10, p.baseDelay(Transient)))
		if sd > p.maxServerDelay() || delay < sd { // delay < sd: overflow
			return StopServerDelay, sd, src, 0
		}
	} else {
		delay = p.Jitter.Delay(n-1, p.baseDelay(class), p.maxDelay(), prevDelay, rnd)
	}
	if hasDeadline && !now.Add(delay).Before(deadline) {
		return StopDeadline, delay, src, 0
	}
	cost, ok := budget.Withdraw(class)
	if !ok {
		return StopBudget, delay, src, 0
	}
	return Retry, delay, src, cost
}

func serverDelay(p *Policy, resp *http.Response, now time.Time) (time.Duration, bool) {
	if resp == nil || p.MaxServerDelay < 0 {
		return 0, false
	}
	return ParseRetryAfter(resp.Header, now)
}

// shallowCopy returns a copy of r that shares its header, URL and body.
func shallowCopy(r *http.Request) *http.Request {
	r2 := new(http.Request)
	*r2 = *r
	return r2
}

func closeBody(b io.ReadCloser) {
	if b != nil {
		b.Close()
	}
}

// discard drains a response that will not be returned, so that its
// connection can be reused, closes it and releases its attempt. The drain is
// bounded in bytes (drainLimit) and in time (drainTimeout): a body that is
// longer, or slower, is closed unread, which costs a new connection but never
// the request's time.
func discard(resp *http.Response, release func()) {
	if resp != nil && resp.Body != nil && resp.Body != http.NoBody {
		body := resp.Body
		// Closing a body ends a read blocked in it (net/http's bodies,
		// HTTP/1 and HTTP/2, allow that from another goroutine).
		timer := time.AfterFunc(drainTimeout, func() { body.Close() })
		io.CopyN(io.Discard, body, drainLimit)
		if timer.Stop() {
			body.Close()
		}
	}
	if release != nil {
		release()
	}
}

// sleep waits for d or until ctx ends, and returns ctx's error in that case.
// A zero wait starts no timer.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

func releaseAll(release func(), cancel context.CancelFunc) {
	if release != nil {
		release()
	}
	if cancel != nil {
		cancel()
	}
}

// onClose makes closing body also run the given cleanups (either may be
// nil). RoundTrip calls it only when there is one, so that a response with
// nothing to clean up is returned untouched.
func onClose(body io.ReadCloser, release func(), cancel context.CancelFunc) io.ReadCloser {
	if body == nil {
		body = http.NoBody
	}
	cb := &cleanupBody{ReadCloser: body, release: release, cancel: cancel}
	if w, ok := body.(io.Writer); ok { // a 101 Switching Protocols body is writable
		return &cleanupRWBody{cleanupBody: cb, w: w}
	}
	return cb
}

type cleanupBody struct {
	io.ReadCloser
	once    sync.Once
	release func()
	cancel  context.CancelFunc
}

func (b *cleanupBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		if b.release != nil {
			b.release()
		}
		if b.cancel != nil {
			b.cancel()
		}
	})
	return err
}

type cleanupRWBody struct {
	*cleanupBody
	w io.Writer
}

func (b *cleanupRWBody) Write(p []byte) (int, error) { return b.w.Write(p) }

var _ http.RoundTripper = (*Transport)(nil)
