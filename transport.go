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
// The reasoning behind each rule, with its sources, is in docs/design.md.
package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
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
// caller's request (each attempt sends a copy), always closes the request
// body, replays the body only through Request.GetBody, drains and closes
// every response it discards, and returns either a response with a nil error
// or an error (an *Error) with no response. A retryable response that is not
// retried (the last attempt's 503, or a 429 when the budget is empty) is
// returned as it is, with a nil error, as the base transport would.
type Transport struct {
	// Base makes each attempt. Nil means a pooled transport from
	// go-cleanhttp, made on first use and private to this Transport (never
	// http.DefaultTransport, whose settings any package may change).
	Base http.RoundTripper

	// Policy decides which attempts are made and when. The zero Policy is
	// the recommended one; see Policy.
	Policy Policy

	// Budget pays for retries. Nil means a private budget of
	// DefaultBudgetTokens made on first use; give several Transports the
	// same Budget to make them share one quota.
	Budget *Budget

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

	once          sync.Once
	defaultBase   http.RoundTripper
	defaultBudget *Budget
}

func (t *Transport) init() {
	if t.Base == nil {
		t.defaultBase = cleanhttp.DefaultPooledTransport()
	}
	if t.Budget == nil {
		t.defaultBudget = NewBudget(DefaultBudgetTokens)
	}
}

// BudgetInUse returns the Budget the Transport draws from: Budget, or the
// private one it made.
func (t *Transport) BudgetInUse() *Budget {
	t.once.Do(t.init)
	return t.budget()
}

// budget is BudgetInUse for callers that already ran init.
func (t *Transport) budget() *Budget {
	if t.Budget != nil {
		return t.Budget
	}
	return t.defaultBudget
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
	if err := ctx.Err(); err != nil {
		closeBody(req.Body)
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
			if out == req {
				out = shallowCopy(req)
			}
			out.Header = cloneHeaderWith(req.Header, name, p.newKey())
			safe = true
		}
	}
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	budget := t.budget()
	observe := t.OnAttempt != nil || t.Logger != nil

	var (
		prevDelay time.Duration
		lastCost  int64
		start     time.Time
		resp      *http.Response
		err       error
		release   func()
	)
	for n := 1; ; n++ {
		if observe {
			start = time.Now()
		}
		if p.AttemptTimeout > 0 {
			resp, release, err = sendAttempt(base, out, p.AttemptTimeout)
		} else {
			resp, err = base.RoundTrip(out)
		}
		class := p.classify(resp, err)

		decision := Done
		var (
			delay time.Duration
			src   DelaySource
			next  *http.Request
		)
		switch {
		case err != nil && ctx.Err() != nil:
			// The caller's context ended (or Policy.Timeout passed) during
			// the attempt: whatever the error says, that is why it failed.
			decision = StopCanceled
		case class.retryable():
			decision, delay, src, lastCost = t.decide(ctx, n, maxAttempts, class, resp, err, safe, replayable, prevDelay, budget)
			if decision == Retry {
				// A request without a body is sent again as it is: nothing
				// in it changes, and the base is done with it once the
				// response is closed. One with a body gets a copy with a
				// fresh body from GetBody.
				next = out
				if req.GetBody != nil && req.Body != nil && req.Body != http.NoBody {
					body, gerr := req.GetBody()
					if gerr != nil {
						budget.give(lastCost)
						decision, next = StopNotReplayable, nil
					} else {
						next = shallowCopy(out)
						next.Body = body
					}
				}
			}
		case class == Success && n == 1:
			budget.give(SuccessReward) // only reads when the bucket is full
		case class == Success:
			budget.give(lastCost) // the retry that succeeded pays nothing
		}

		if observe {
			a := Attempt{Request: out, Number: n, Err: err, Class: class, Decision: decision,
				Delay: delay, DelaySource: src, Tokens: budget.Available(), Duration: time.Since(start)}
			if resp != nil {
				a.Status = resp.StatusCode
			}
			if t.OnAttempt != nil {
				t.OnAttempt(a)
			}
			if t.Logger != nil && (class.retryable() || n > 1) {
				t.log(ctx, a)
			}
		}

		if decision != Retry {
			if resp != nil {
				if release != nil || cancel != nil {
					resp.Body = onClose(resp.Body, release, cancel)
				}
				return resp, nil
			}
			if cancel != nil {
				cancel()
			}
			if err == nil { // a base that broke the contract: neither
				err = errNoResponse
			}
			return nil, &Error{Attempts: n, Decision: decision, Err: err}
		}

		discard(resp, release)
		if werr := sleep(ctx, delay); werr != nil {
			if next != out {
				closeBody(next.Body)
			}
			if cancel != nil {
				cancel()
			}
			cause := werr
			if err != nil {
				cause = fmt.Errorf("%w; last attempt: %w", werr, err)
			}
			return nil, &Error{Attempts: n, Decision: StopCanceled, Err: cause}
		}
		prevDelay = delay
		out = next
	}
}

// decide chooses what follows a retryable outcome, and takes the retry's cost
// from the budget when it is a retry.
func (t *Transport) decide(ctx context.Context, n, maxAttempts int, class Class, resp *http.Response, err error,
	safe, replayable bool, prevDelay time.Duration, budget *Budget,
) (d Decision, delay time.Duration, src DelaySource, cost int64) {
	p := &t.Policy
	switch {
	case ctx.Err() != nil:
		return StopCanceled, 0, FromBackoff, 0
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
		// all come back in the same instant; never less than asked.
		delay = sd + uniform(rnd, sd/10)
		if sd > p.maxServerDelay() || delay < sd { // delay < sd: overflow
			return StopServerDelay, sd, src, 0
		}
	} else {
		delay = p.Jitter.Delay(n-1, p.baseDelay(class), p.maxDelay(), prevDelay, rnd)
	}
	if hasDeadline && !now.Add(delay).Before(deadline) {
		return StopDeadline, delay, src, 0
	}
	cost = class.retryCost()
	if !budget.take(cost) {
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

// sendAttempt makes one attempt. With a per-attempt timeout, the attempt gets
// its own context, cancelled if the response headers do not arrive in time;
// release must then be called once the response body is done with.
func sendAttempt(base http.RoundTripper, req *http.Request, timeout time.Duration) (resp *http.Response, release func(), err error) {
	parent := req.Context()
	actx, acancel := context.WithCancel(parent)
	timer := time.AfterFunc(timeout, acancel)
	resp, err = base.RoundTrip(req.WithContext(actx))
	// The timer stops at the response headers, so the body that is returned
	// can be read for as long as the caller's context allows.
	if !timer.Stop() && parent.Err() == nil {
		discard(resp, acancel)
		return nil, nil, fmt.Errorf("%w after %v", ErrAttemptTimeout, timeout)
	}
	if err != nil {
		acancel()
		return nil, nil, err
	}
	return resp, acancel, nil
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

// discard drains a response that will not be returned, up to drainLimit so
// its connection can be reused, closes it and releases its attempt.
func discard(resp *http.Response, release func()) {
	if resp != nil && resp.Body != nil {
		io.CopyN(io.Discard, resp.Body, drainLimit)
		resp.Body.Close()
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
