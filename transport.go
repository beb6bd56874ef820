// Package retryhttp retries failed HTTP calls without making the failure
// worse.
//
// A Transport wraps any http.RoundTripper. It retries 502, 503 and 504,
// 429 as throttling, and network errors before a response. It waits with
// capped full-jitter backoff, unless the server asks for a delay. Every
// attempt of a POST or PATCH carries one Idempotency-Key. Each retry is paid
// from a Budget, so that an outage is not multiplied by retries. Every
// attempt and wait stays inside one deadline.
//
//	client := &http.Client{Transport: &retryhttp.Transport{
//		Policy: retryhttp.Policy{Timeout: 10 * time.Second},
//	}}
//
// The rest is opt-in. Handler marks a service's error responses when its
// own calls used up their retries, so that the layers above do not retry
// them. NewRatioBudget and the redisbudget module are other Budgets.
// Policy.HedgeDelay sends a second copy of a slow request. Hedges are not
// paid from the Budget: Policy.HedgeRatio bounds them. A RateLimiter slows
// every attempt of a client that is being throttled. WithReport gives a
// per-request view of what happened.
//
// docs/design.md gives the reason for each rule, with its sources.
package retryhttp

import (
	"log/slog"
	"net/http"
	"reflect"
	"sync"

	"github.com/hashicorp/go-cleanhttp"
)

// Transport is an http.RoundTripper that retries failed attempts through
// its Base. Its Policy says which attempts are made. Its Budget pays for the
// retries.
//
// The zero Transport is ready to use: the zero Policy over a pooled
// transport of its own, with a private token bucket. A Transport is safe for
// concurrent use. Like http.Transport, it should be reused, so that its
// budget and connections are shared. Its fields must not change after its
// first use.
//
// RoundTrip honours the http.RoundTripper contract. It never modifies the
// caller's request: an attempt that needs a change sends a copy. It always
// closes the request body, and replays it only through Request.GetBody. It
// drains and closes every response it discards, bounded in bytes and time.
// It returns a response with a nil error, or an *Error with no response. A
// retryable response that is not retried (the last 503, or a 429 when the
// budget is empty) is returned as it is. A retry whose wait ends first (the
// context ended, or the Limiter had no permit) ends with an *Error: the
// response that called for it was drained when the wait began.
type Transport struct {
	// Base makes each attempt. Nil means a pooled go-cleanhttp transport,
	// made on first use and private to this Transport, with
	// CheckProxyConnect as its OnProxyConnectResponse. It is never
	// http.DefaultTransport, whose settings any package may change.
	Base http.RoundTripper

	// Policy decides which attempts are made and when. The zero Policy is
	// the recommended one; see Policy.
	Policy Policy

	// Budget pays for retries. Nil means a private token bucket of
	// DefaultBudgetTokens, made on first use. Transports that share a
	// Budget share one quota.
	Budget Budget

	// Limiter, if not nil, slows the Transport while it is throttled. Every
	// attempt, the first included, waits for a send permit from it. A
	// request whose permit would come too late fails at once
	// (StopRateLimited). Transports that share a RateLimiter share one rate.
	// Nil means no limit.
	Limiter *RateLimiter

	// PerHost, if not nil, gives each destination a budget and a
	// RateLimiter of its own, in place of Budget and Limiter. One sick host
	// then spends only its own retries. Nil means one Budget and one
	// Limiter for every destination.
	PerHost *PerHost

	// OnAttempt, if not nil, is called after every attempt, once the
	// decision is made and before any wait. It runs on the goroutine that
	// called RoundTrip, and the request waits for it.
	OnAttempt func(Attempt)

	// OnEnd, if not nil, is called once for every request as RoundTrip
	// returns, after the last OnAttempt call, with the caller's request.
	// It sees every way a request ends, one with no attempt included, or
	// one that ended in the wait for a retry. It runs on the goroutine that
	// called RoundTrip, and the caller waits for it. It is not called when
	// a hook panics.
	OnEnd func(*http.Request, Report)

	// Logger, if not nil, receives one line per retry decision. Info says
	// "retryhttp: retrying" and "retryhttp: done after retry". Warn says
	// "retryhttp: giving up" on a retryable failure, and "retryhttp: no
	// send permit" for an attempt the Limiter stopped. A line carries the
	// method, the URL without user info, query or fragment, the attempt,
	// the status or error, the class and the decision. It also carries the
	// delay and its source, and the tokens left. It carries
	// budget_fallback, rate_limit and permit_wait when they apply. It never
	// carries a header or a body. Nil means no logging.
	Logger *slog.Logger

	once        sync.Once
	plain       bool         // a first attempt of an idempotent request only needs sending
	bucket      *tokenBucket // inUse, when it is this package's token bucket
	defaultBase http.RoundTripper
	inUse       Budget      // Budget, or a private bucket
	hedges      lazyHedging // made by the first request that may be hedged
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
		t.inUse = NewTokenBucket(DefaultBudgetTokens)
	}
	t.bucket, _ = t.inUse.(*tokenBucket) // it never panics: nothing to clean up after it
	p := &t.Policy
	t.plain = t.bucket != nil && t.OnAttempt == nil && t.OnEnd == nil && t.Logger == nil && t.Limiter == nil && t.PerHost == nil &&
		p.Timeout <= 0 && p.AttemptTimeout <= 0 && p.HedgeDelay <= 0 && !p.measures() &&
		!p.SendAttemptHeader && p.Classify == nil
}

// isNilPointer reports whether b is a nil pointer in a non-nil interface, as
// Transport{Budget: b} makes of a nil pointer variable.
func isNilPointer(b Budget) bool {
	v := reflect.ValueOf(b)
	return v.Kind() == reflect.Pointer && v.IsNil()
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

// RoundTrip sends req through the base transport, retrying as the Policy
// and the Budget allow. See Transport for the contract.
//
// The loop, in roundTrip, is the whole algorithm. Each step is a method of
// the request's call (call.go), which owns everything the request holds.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.once.Do(t.init)
	if t.plain && idempotentMethod(req.Method) {
		// Nothing to set up: no hook, no deadline, no key, no Report or
		// Override on the context. The first attempt is sent at once, and
		// an answer that is not retried goes back as the loop would return
		// it. Anything else resumes the loop at its decision.
		if ctx := req.Context(); ctx.Err() == nil && ctx.Value(requestKey{}) == nil {
			resp, err := t.base().RoundTrip(req)
			if (resp == nil) == (err == nil) {
				resp, err = repair(resp, err)
			}
			if err == nil {
				if class := statusClass(resp.StatusCode); !class.retryable() {
					t.bucket.Deposit(class == Success)
					return resp, nil
				}
			}
			return t.roundTrip(req, true, resp, err)
		}
	}
	return t.roundTrip(req, false, nil, nil)
}

// roundTrip is RoundTrip's loop. With sent, the first attempt was made and
// answered resp and err.
func (t *Transport) roundTrip(req *http.Request, sent bool, resp *http.Response, err error) (*http.Response, error) {
	var c call
	defer c.cleanup() // on every way out, a panicking hook's included
	if sent {
		c.resume(t, req, resp, err)
	} else if err := c.start(t, req); err != nil {
		return nil, err
	}
	for ; ; sent = false {
		if !sent {
			if err := c.acquire(); err != nil { // a send permit, when limiting
				return nil, c.stopBefore(err)
			}
			c.send() // one attempt, hedged or timed as the Policy says
		}
		c.decide()  // retry or stop; a retry is paid for here
		c.observe() // the hook, the Logger and the Report
		if c.v.decision != Retry {
			return c.finish()
		}
		if err := c.wait(); err != nil { // backoff, or the server's delay
			return nil, c.stopBefore(err)
		}
	}
}

var _ http.RoundTripper = (*Transport)(nil)
