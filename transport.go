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
	"log/slog"
	"net/http"
	"reflect"
	"sync"

	"github.com/hashicorp/go-cleanhttp"
)

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
// response with a nil error or an error (an *Error) with no response. A
// retryable response that is not retried (the last attempt's 503, or a 429
// when the budget is empty) is returned as it is, with a nil error, as the
// base transport would. A retry that was planned, and whose wait the
// context's end or the Limiter stops before it is sent (ErrRateLimited),
// ends with an *Error instead: the response that called for it was drained
// when the wait began.
type Transport struct {
	// Base makes each attempt. Nil means a pooled transport from
	// go-cleanhttp, made on first use and private to this Transport (never
	// http.DefaultTransport, whose settings any package may change), with
	// CheckProxyConnect as its OnProxyConnectResponse.
	Base http.RoundTripper

	// Policy decides which attempts are made and when. The zero Policy is
	// the recommended one; see Policy.
	Policy Policy

	// Budget pays for retries. Nil means a private token bucket of
	// DefaultBudgetTokens, made on first use. Transports that share a
	// Budget share one quota.
	Budget Budget

	// Limiter, if not nil, slows the Transport while it is being throttled:
	// every attempt, the first of a request included, waits for a send
	// permit from it, and a request whose permit would come too late to
	// leave room for the attempt before its deadline fails at once
	// (StopRateLimited). Give several Transports the same RateLimiter to
	// make them share one rate. Nil means no limit.
	Limiter *RateLimiter

	// PerHost, if not nil, gives each destination (scheme, host and port)
	// a budget and a RateLimiter of its own, in place of Budget and
	// Limiter, so that one sick host does not spend the retries, or cut
	// the send rate, of the others. Nil means one Budget and one Limiter
	// for every destination.
	PerHost *PerHost

	// OnAttempt, if not nil, is called after every attempt, once the
	// decision about it is made and before any wait, on the goroutine that
	// called RoundTrip. It must not block for long: the request waits for
	// it.
	OnAttempt func(Attempt)

	// OnEnd, if not nil, is called once for every request as RoundTrip
	// returns, on the goroutine that called it, after the last OnAttempt
	// call. It sees every way a request ends, those in which no hook
	// follows the last attempt (the context ended in the wait for a retry,
	// or the Limiter had no permit for it) and those with no attempt at
	// all included. It is not called when a hook panics. It must not block
	// for long: the caller waits for it.
	OnEnd func(*http.Request, Report)

	// Logger, if not nil, receives one line per retry decision: at Info for
	// a retry ("retryhttp: retrying") and for a success after retries
	// ("retryhttp: done after retry"), at Warn for giving up on a retryable
	// failure ("retryhttp: giving up"), and at Warn for a request whose
	// next attempt got no send permit from the Limiter ("retryhttp: no
	// send permit"; no attempt, so no OnAttempt call, is made for it).
	// Lines carry the method, the URL without user info, query or
	// fragment, the attempt, the status or error, the class, the decision,
	// the delay and its source, and the tokens left; budget_fallback when
	// a shared budget pays from its local fallback, rate_limit when the
	// Limiter is limiting, and permit_wait when the attempt waited for a
	// permit. They never carry a header or a body. Nil means no logging.
	Logger *slog.Logger

	once        sync.Once
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

// RoundTrip sends req through the base transport, retrying as the Policy and
// the Budget allow. See Transport for the contract.
//
// The loop is the whole algorithm; each step is a method of the request's
// call (call.go), which owns everything the request holds.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	t.once.Do(t.init)
	var c call
	defer c.cleanup() // on every way out, a panicking hook's included
	if err := c.start(t, req); err != nil {
		return nil, err
	}
	for {
		if err := c.acquire(); err != nil { // a send permit, when limiting
			return nil, c.stopBefore(err)
		}
		c.send()    // one attempt, hedged or timed as the Policy says
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
