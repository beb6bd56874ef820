package retryhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// watchCtx is a parent context that sees whether the contexts derived from
// it with a cancel (Policy.Timeout's, an attempt's, a hedged copy's) are
// released: the context package registers each with its AfterFunc, and
// calls the returned stop func once the derived context is canceled.
type watchCtx struct {
	context.Context
	done                chan struct{}
	registered, stopped atomic.Int32
}

func newWatchCtx() *watchCtx {
	return &watchCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *watchCtx) Done() <-chan struct{} { return c.done }

func (c *watchCtx) AfterFunc(func()) func() bool {
	c.registered.Add(1)
	return func() bool { c.stopped.Add(1); return true }
}

// held reports how many derived contexts are still running.
func (c *watchCtx) held() int { return int(c.registered.Load() - c.stopped.Load()) }

func TestPanicLeavesNothingHeld(t *testing.T) {
	// Whatever hook panics, and wherever: the panic reaches the caller, and
	// nothing stays open, running or spent: no response body, no derived
	// context (Timeout, attempt, hedged copy), no request body, no tokens.
	boom := func() { panic("hook") }
	tests := []struct {
		name   string
		steps  []rht.Step
		method string
		policy Policy
		hook   func(Attempt)
	}{
		{"NewIdempotencyKey, with a Timeout", nil, "POST",
			Policy{Timeout: time.Minute, NewIdempotencyKey: func() string { boom(); return "" }}, nil},
		{"Classify, with a Timeout", []rht.Step{rht.Status(503)}, "GET",
			Policy{Timeout: time.Minute, Classify: func(*http.Response, error) Class { boom(); return 0 }}, nil},
		{"Classify, under AttemptTimeout", []rht.Step{rht.Status(503)}, "GET",
			Policy{AttemptTimeout: time.Second, Classify: func(*http.Response, error) Class { boom(); return 0 }}, nil},
		{"Classify, with hedged copies in flight", []rht.Step{rht.Status(503).WithDelay(20 * time.Millisecond), rht.Status(200).WithDelay(time.Second)}, "GET",
			Policy{HedgeDelay: 10 * time.Millisecond, MaxHedges: 2, Classify: func(*http.Response, error) Class { boom(); return 0 }}, nil},
		{"OnAttempt, after a Retry decision", []rht.Step{rht.Status(503), rht.Status(200)}, "PUT",
			Policy{Timeout: time.Minute}, func(a Attempt) {
				if a.Decision == Retry {
					boom()
				}
			}},
		{"OnAttempt, after a hedged attempt", []rht.Step{rht.Status(200).WithDelay(time.Second), rht.Status(200)}, "GET",
			Policy{HedgeDelay: 10 * time.Millisecond}, func(Attempt) { boom() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.steps...)
				tr := &Transport{Base: base, Policy: tc.policy, OnAttempt: tc.hook}
				ctx := newWatchCtx()
				var closed, replays, replayed atomic.Int32
				req, _ := http.NewRequestWithContext(ctx, tc.method, "http://example.test/", closeTracker{strings.NewReader("payload"), &closed})
				req.GetBody = func() (io.ReadCloser, error) {
					replayed.Add(1)
					return closeTracker{strings.NewReader("payload"), &replays}, nil
				}
				func() {
					defer func() {
						if recover() == nil {
							t.Error("got no panic; want the hook's panic to reach the caller")
						}
					}()
					tr.RoundTrip(req)
				}()
				synctest.Wait() // copies still in flight see their cancellation
				if got := ctx.held(); got != 0 {
					t.Errorf("got %d derived contexts still running; want 0", got)
				}
				if got := base.OpenBodies(); got != 0 {
					t.Errorf("got %d open response bodies; want 0", got)
				}
				if got := closed.Load(); got != 1 {
					t.Errorf("got the request body closed %d times; want 1", got)
				}
				if got, want := replays.Load(), replayed.Load(); got != want {
					t.Errorf("got %d replay bodies closed; want all %d", got, want)
				}
				if got := tr.BudgetInUse().Available(); got < DefaultBudgetTokens-HedgeCost*len(base.Attempts()) || (tc.policy.HedgeDelay == 0 && got != DefaultBudgetTokens) {
					t.Errorf("got %d tokens; want %d, less only the hedges sent", got, DefaultBudgetTokens)
				}
			})
		})
	}
}

// cannedBase answers every request with the same response, as the
// benchmarks' stub does, and closes request bodies.
type cannedBase struct{ resp *http.Response }

func (b cannedBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		r.Body.Close()
	}
	return b.resp, nil
}

func TestAllocations(t *testing.T) {
	// What each path costs in allocations, beyond the base's own, exactly:
	// the success path of a capability that is off, or idle, costs none.
	if testing.Short() {
		t.Skip("allocation counts")
	}
	ok := cannedBase{&http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody}}
	get, _ := http.NewRequest("GET", "http://example.test/", nil)
	post, _ := http.NewRequest("POST", "http://example.test/", strings.NewReader("payload"))
	keyed, _ := http.NewRequest("POST", "http://example.test/", strings.NewReader("payload"))
	keyed.Header.Set(DefaultIdempotencyHeader, "k1")
	tests := []struct {
		name string
		tr   *Transport
		req  *http.Request
		want float64
	}{
		{"GET", &Transport{Base: ok}, get, 0},
		{"GET, idle RateLimiter", &Transport{Base: ok, Limiter: &RateLimiter{}}, get, 0},
		{"GET, RatioBudget", &Transport{Base: ok, Budget: &RatioBudget{}}, get, 0},
		{"GET, hedging on, answered before HedgeDelay", &Transport{Base: ok, Policy: Policy{HedgeDelay: time.Hour}}, get, 11},
		{"GET, PerHost, a destination already seen", &Transport{Base: ok, PerHost: &PerHost{}}, get, 0},
		{"GET, PerHost with limiters, a destination already seen", &Transport{Base: ok, PerHost: &PerHost{Limiter: func(string) *RateLimiter { return &RateLimiter{} }}}, get, 0},
		{"GET with an Override", &Transport{Base: ok}, get.WithContext(WithOverride(get.Context(), Override{MaxAttempts: 5})), 0},
		{"GET, Policy.Timeout", &Transport{Base: ok, Policy: Policy{Timeout: time.Minute}}, get, 6},
		{"GET with an Override's Timeout", &Transport{Base: ok}, get.WithContext(WithOverride(get.Context(), Override{Timeout: time.Minute})), 6},
		{"POST with the caller's key", &Transport{Base: ok}, keyed, 0},
		{"POST, key generated", &Transport{Base: ok}, post, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := testing.AllocsPerRun(200, func() {
				resp, err := tc.tr.RoundTrip(tc.req)
				if err != nil || resp.StatusCode != 200 {
					t.Fatal(resp, err)
				}
			})
			if got != tc.want {
				t.Errorf("got %v allocations per request; want %v", got, tc.want)
			}
		})
	}
}

// bothBase returns a response and an error together, as a broken base
// might, and counts the closes of the responses it hands out.
type bothBase struct {
	opened, closed atomic.Int32
	err            error
}

func (b *bothBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.opened.Add(1)
	return &http.Response{StatusCode: 200, Header: http.Header{}, Request: r,
		Body: closeTracker{strings.NewReader("x"), &b.closed}}, b.err
}

func TestBaseReturningResponseAndError(t *testing.T) {
	for _, p := range []Policy{{}, {AttemptTimeout: time.Second}} {
		t.Run("AttemptTimeout="+p.AttemptTimeout.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &bothBase{err: errReset}
				p.Rand = lowRand
				resp, err := (&Transport{Base: base, Policy: p}).RoundTrip(newReq(t, "GET", ""))
				if resp != nil || !errors.Is(err, errReset) {
					t.Fatalf("got (%v, %v); want (nil, the base's error)", resp, err)
				}
				var re *Error
				if !errors.As(err, &re) || re.Attempts != 3 || re.Decision != StopAttempts {
					t.Errorf("got %v; want the error retried to StopAttempts after 3 attempts", err)
				}
				if o, c := base.opened.Load(), base.closed.Load(); o != 3 || c != 3 {
					t.Errorf("got %d responses, %d closed; want 3 and 3", o, c)
				}
			})
		})
	}
}

// closeTracker is a request body that records its Close.
type closeTracker struct {
	io.Reader
	closed *atomic.Int32
}

func (c closeTracker) Close() error { c.closed.Add(1); return nil }

func TestPanickingHooksCleanUp(t *testing.T) {
	// A hook's panic goes on to the caller, but nothing stays open or
	// spent: the response body, the Timeout, the next attempt's body, the
	// retry's tokens.
	tests := []struct {
		name string
		tr   func() *Transport
	}{
		{"Classify", func() *Transport {
			return &Transport{Policy: Policy{Classify: func(*http.Response, error) Class { panic("classify") }}}
		}},
		{"OnAttempt after a Retry decision", func() *Transport {
			return &Transport{OnAttempt: func(a Attempt) {
				if a.Decision == Retry {
					panic("hook")
				}
			}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(rht.Status(503).WithBody("busy"), rht.Status(200))
				var ctxs []context.Context
				tr := tc.tr()
				tr.Base = roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					ctxs = append(ctxs, r.Context())
					return base.RoundTrip(r)
				})
				tr.Policy.Timeout = time.Minute
				var replays atomic.Int32
				req := newReq(t, "PUT", "payload")
				req.GetBody = func() (io.ReadCloser, error) {
					return closeTracker{strings.NewReader("payload"), &replays}, nil
				}
				func() {
					defer func() {
						if recover() == nil {
							t.Error("got no panic; want the hook's panic to reach the caller")
						}
					}()
					tr.RoundTrip(req)
				}()
				if got := base.OpenBodies(); got != 0 {
					t.Errorf("got %d open response bodies; want 0", got)
				}
				if err := ctxs[0].Err(); err == nil {
					t.Error("the Timeout's context is still running; want it released")
				}
				if got := tr.BudgetInUse().Available(); got != DefaultBudgetTokens {
					t.Errorf("got %d tokens; want %d (no retry was made)", got, DefaultBudgetTokens)
				}
				if got := replays.Load(); tc.name != "Classify" && got != 1 {
					t.Errorf("got the replay body closed %d times; want 1", got)
				}
			})
		})
	}
}

func TestCanceledWaitReturnsItsTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &Transport{Base: rht.NewTransport(rht.Status(503)), Policy: Policy{Rand: highRand}}
		for range 10 {
			ctx, cancel := context.WithCancel(context.Background())
			req := newReq(t, "GET", "").WithContext(ctx)
			time.AfterFunc(10*time.Millisecond, cancel) // during the 50ms wait
			_, err := tr.RoundTrip(req)
			var re *Error
			if !errors.As(err, &re) || re.Decision != StopCanceled || re.Attempts != 1 {
				t.Fatalf("got %v; want StopCanceled after 1 attempt", err)
			}
			cancel()
		}
		if got := tr.BudgetInUse().Available(); got != DefaultBudgetTokens {
			t.Errorf("got %d tokens after 10 canceled waits; want %d", got, DefaultBudgetTokens)
		}
	})
}
