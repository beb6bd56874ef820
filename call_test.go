package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
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
	keyed.Header.Set(defaultIdempotencyHeader, "k1")
	tests := []struct {
		name string
		tr   *Transport
		req  *http.Request
		want float64
	}{
		{"GET", &Transport{Base: ok}, get, 0},
		{"GET, idle RateLimiter", &Transport{Base: ok, Limiter: &RateLimiter{}}, get, 0},
		{"GET, RatioBudget", &Transport{Base: ok, Budget: &ratioBudget{}}, get, 0},
		{"GET, OnEnd", &Transport{Base: ok, OnEnd: func(*http.Request, Report) {}}, get, 0},
		// A copy's context, its cancel with errCopyCanceled as the cause, its
		// deep copy of the request, its goroutine and the race: hedging
		// costs allocations when it is on.
		{"GET, hedging on, answered before HedgeDelay", &Transport{Base: ok, Policy: Policy{HedgeDelay: time.Hour, HedgeRatio: 1}}, get, 14},
		{"GET, PerHost, a destination already seen", &Transport{Base: ok, PerHost: &PerHost{}}, get, 0},
		{"GET, PerHost with limiters, a destination already seen", &Transport{Base: ok, PerHost: &PerHost{Limiter: func(string) *RateLimiter { return &RateLimiter{} }}}, get, 0},
		{"GET with an Override", &Transport{Base: ok}, get.WithContext(WithOverride(get.Context(), Override{MaxAttempts: 5})), 0},
		{"GET, Policy.Timeout", &Transport{Base: ok, Policy: Policy{Timeout: time.Minute}}, get, 6},
		{"GET with an Override's Timeout", &Transport{Base: ok}, get.WithContext(WithOverride(get.Context(), Override{Timeout: time.Minute})), 6},
		{"POST with the caller's key", &Transport{Base: ok}, keyed, 0},
		{"POST, key generated", &Transport{Base: ok}, post, 3},
		{"GET, AttemptTimeoutQuantile without AttemptTimeout: ignored", &Transport{Base: ok, Policy: Policy{AttemptTimeoutQuantile: 0.999}}, get, 0},
		{"GET, AttemptTimeout", &Transport{Base: ok, Policy: Policy{AttemptTimeout: time.Second}}, get, 5},
		{"GET, AttemptTimeoutQuantile of 1: ignored, as AttemptTimeout alone", &Transport{Base: ok, Policy: Policy{AttemptTimeout: time.Second, AttemptTimeoutQuantile: 1}}, get, 5},
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
		{"OnEnd", func() *Transport {
			return &Transport{OnEnd: func(*http.Request, Report) { panic("hook") }}
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
				if got := tr.budgetInUse().Available(); got != DefaultBudgetTokens {
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
		if got := tr.budgetInUse().Available(); got != DefaultBudgetTokens {
			t.Errorf("got %d tokens after 10 canceled waits; want %d", got, DefaultBudgetTokens)
		}
	})
}

// A budget that refuses a retry but returns Tokens describing the refused
// cost: the Transport ignores them, and never refunds a payment that was not
// taken.
func TestRefusedWithdrawPaysNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		budget := newLedger(t)
		budget.refuse, budget.refusedTokens = true, true
		base := rht.NewTransport(rht.Reset())
		tr := &Transport{Base: base, Budget: budget}
		_, err := tr.RoundTrip(newReq(t, "GET", ""))
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopBudget {
			t.Fatalf("got %v; want StopBudget", err)
		}
		budget.check(t)
	})
}

// Every payment a Budget issues is settled at
// most once, only Tokens it issued are refunded, and each ends as the
// Tokens doc says: refunded (sent=false) when the retry is never sent,
// refunded (sent=true) when it succeeded or the hedge won, kept otherwise.
// Checked with a ledger budget across cancellation, GetBody failure,
// panicking hooks (OnAttempt, Logger handler, Classify) and hedging.
func TestEachPaymentSettledOnce(t *testing.T) {
	slow := func(code int) rht.Step { return rht.Status(code).WithDelay(100 * time.Millisecond) }
	tests := []struct {
		name        string
		steps       []rht.Step
		method      string
		policy      Policy
		cancelAt    time.Duration
		getBodyErr  bool
		hook        func(Attempt)
		logger      bool
		wantPanic   bool
		unsent, won int // refunds with sent=false, sent=true
		spent       int // never refunded
	}{
		{"retry succeeds", []rht.Step{rht.Status(503), rht.Status(200)}, "GET", Policy{}, 0, false, nil, false, false, 0, 1, 0},
		{"retries fail", []rht.Step{rht.Status(503)}, "GET", Policy{}, 0, false, nil, false, false, 0, 0, 2},
		{"retry canceled in its wait", []rht.Step{rht.Status(503)}, "GET", Policy{Rand: highRand}, 10 * time.Millisecond, false, nil, false, false, 1, 0, 0},
		{"retry's body cannot be had", []rht.Step{rht.Status(503)}, "PUT", Policy{}, 0, true, nil, false, false, 1, 0, 0},
		{"OnAttempt panics after Retry", []rht.Step{rht.Status(503)}, "GET", Policy{}, 0, false,
			func(a Attempt) {
				if a.Decision == Retry {
					panic("hook")
				}
			}, false, true, 1, 0, 0},
		{"Logger handler panics after Retry", []rht.Step{rht.Status(503)}, "GET", Policy{}, 0, false, nil, true, true, 1, 0, 0},
		{"Timeout refuses the second wait", []rht.Step{rht.Status(503)}, "GET", Policy{Rand: highRand, BaseDelay: time.Second, Timeout: 1500 * time.Millisecond}, 0, false, nil, false, false, 0, 0, 1},
		{"hedge wins", []rht.Step{slow(200), rht.Status(200)}, "GET", Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}, 0, false, nil, false, false, 0, 0, 0},
		{"hedge loses", []rht.Step{rht.Status(200).WithDelay(20 * time.Millisecond), slow(200)}, "GET", Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}, 0, false, nil, false, false, 0, 0, 0},
		{"retry's hedge wins", []rht.Step{rht.Status(503), slow(200), rht.Status(200)}, "GET", Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, Rand: lowRand}, 0, false, nil, false, false, 0, 1, 0},
		{"keyed POST, hedge canceled by the caller", []rht.Step{rht.Hang()}, "POST", Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}, 50 * time.Millisecond, false, nil, false, false, 0, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				budget := newLedger(t)
				base := rht.NewTransport(tc.steps...)
				tr := &Transport{Base: base, Budget: budget, Policy: tc.policy, OnAttempt: tc.hook}
				if tc.logger {
					tr.Logger = slog.New(panicHandler{})
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.cancelAt > 0 {
					time.AfterFunc(tc.cancelAt, cancel)
				}
				req := newReq(t, tc.method, "payload").WithContext(ctx)
				req.GetBody = func() (io.ReadCloser, error) {
					if tc.getBodyErr {
						return nil, errors.New("no body")
					}
					return io.NopCloser(strings.NewReader("payload")), nil
				}
				func() {
					defer func() {
						if p := recover(); (p != nil) != tc.wantPanic {
							t.Errorf("got panic %v; want panic %v", p, tc.wantPanic)
						}
					}()
					if resp, err := tr.RoundTrip(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}()
				synctest.Wait()
				budget.check(t)
				budget.mu.Lock()
				var unsent, won int
				for _, sent := range budget.refunded {
					if sent {
						won++
					} else {
						unsent++
					}
				}
				spent := len(budget.issued)
				budget.mu.Unlock()
				if unsent != tc.unsent || won != tc.won || spent != tc.spent {
					t.Errorf("got %d refunded unsent, %d refunded won, %d kept spent; want %d, %d, %d", unsent, won, spent, tc.unsent, tc.won, tc.spent)
				}
				if got := base.OpenBodies(); got != 0 {
					t.Errorf("got %d response bodies open; want 0", got)
				}
			})
		})
	}
}

// Across hedging, Timeout, AttemptTimeout,
// SendAttemptHeader, a Limiter that limits, generated and caller's keys and
// caller cancellation, RoundTrip never changes the caller's request (its
// header, URL, body, context), closes the caller's body exactly once and
// every GetBody body exactly once, returns a response xor an error, and
// leaves no response body open but the one returned.
func TestRequestContractMatrix(t *testing.T) {
	slow := func(code int) rht.Step { return rht.Status(code).WithDelay(30 * time.Millisecond) }
	scripts := map[string][]rht.Step{
		"503 then 200":          {rht.Status(503).WithBody("busy"), rht.Status(200)},
		"slow, hedge wins":      {slow(200), rht.Status(200)},
		"slow 503s then 200":    {slow(503), slow(503), rht.Status(200)},
		"429 always":            {rht.Status(429).WithBody("slow down")},
		"reset then hang":       {rht.Reset(), rht.Hang()},
		"commit then drop, 200": {rht.CommitThenDrop(), rht.Status(200)},
	}
	policies := map[string]Policy{
		"plain":                   {},
		"hedged":                  {HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, MaxHedges: 2},
		"hedged+Timeout+header":   {HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, Timeout: 5 * time.Second, SendAttemptHeader: true},
		"AttemptTimeout+Timeout":  {AttemptTimeout: 20 * time.Millisecond, Timeout: 5 * time.Second},
		"AttemptTimeout+hedged":   {AttemptTimeout: 5 * time.Millisecond, HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1},
		"header+AttemptTimeout":   {AttemptTimeout: 50 * time.Millisecond, SendAttemptHeader: true},
		"short Timeout":           {Timeout: 25 * time.Millisecond, HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1},
		"MaxAttempts 1, hedged":   {MaxAttempts: 1, HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1},
		"MaxAttempts 5, 3 hedges": {MaxAttempts: 5, MaxHedges: 3, HedgeDelay: 5 * time.Millisecond, HedgeRatio: 1},
	}
	for sname, steps := range scripts {
		for pname, p := range policies {
			for _, method := range []string{"GET", "PUT", "POST", "POST+key"} {
				for _, limit := range []bool{false, true} {
					for _, cancelAt := range []time.Duration{0, 15 * time.Millisecond} {
						name := fmt.Sprintf("%s/%s/%s/limit=%v/cancel=%v", sname, pname, method, limit, cancelAt)
						t.Run(name, func(t *testing.T) {
							synctest.Test(t, func(t *testing.T) {
								checkContract(t, steps, p, method, limit, cancelAt)
							})
						})
					}
				}
			}
		}
	}
}

func checkContract(t *testing.T, steps []rht.Step, p Policy, method string, limit bool, cancelAt time.Duration) {
	var lim *RateLimiter
	if limit {
		lim = &RateLimiter{}
		warm := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, warm, newReq(t, "GET", ""))
	}
	base := rht.NewTransport(steps...)
	p.Rand = lowRand
	tr := &Transport{Base: base, Policy: p, Limiter: lim, Budget: newLedger(t)}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute) // a Hang ends
	defer cancel()
	if cancelAt > 0 {
		time.AfterFunc(cancelAt, cancel)
	}
	var closed, replays, replayed atomic.Int32
	m := strings.TrimSuffix(method, "+key")
	req, _ := http.NewRequestWithContext(ctx, m, "http://example.test/p?q=1", closeTracker{strings.NewReader("payload"), &closed})
	req.GetBody = func() (io.ReadCloser, error) {
		replayed.Add(1)
		return closeTracker{strings.NewReader("payload"), &replays}, nil
	}
	req.Header.Set("X-Mine", "v")
	if strings.HasSuffix(method, "+key") {
		req.Header.Set(defaultIdempotencyHeader, "caller-key")
	}
	hdr := req.Header.Clone()
	body, u, rctx := req.Body, req.URL.String(), req.Context()

	resp, err := tr.RoundTrip(req)
	if (resp == nil) == (err == nil) {
		t.Fatalf("got (%v, %v); want exactly one of a response and an error", resp, err)
	}
	if resp != nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	time.Sleep(time.Hour) // losers and hung copies finish
	synctest.Wait()
	if !equalHeader(req.Header, hdr) || req.Body != body || req.URL.String() != u || req.Context() != rctx || req.Method != m {
		t.Errorf("the caller's request was modified: header %v (was %v)", req.Header, hdr)
	}
	if got := closed.Load(); got != 1 {
		t.Errorf("got the caller's body closed %d times; want 1", got)
	}
	if got, want := replays.Load(), replayed.Load(); got != want {
		t.Errorf("got %d of %d GetBody bodies closed; want all, once", got, want)
	}
	if got := base.OpenBodies(); got != 0 {
		t.Errorf("got %d response bodies open; want 0", got)
	}
	tr.Budget.(*ledger).check(t)
}

// A panic in any hook (NewIdempotencyKey, Classify, OnAttempt, Rand, the
// Logger's handler, GetBody for a retry), wherever it is called (with a
// Timeout, under AttemptTimeout, with hedged copies in flight, with a
// Limiter or without), reaches the caller and leaves nothing held: no
// derived context running (Timeout, attempt, hedged copy), no response
// body open, every request body closed once, no payment unsettled but
// hedges that were sent.
func TestPanicsInEveryHookLeaveNothingHeld(t *testing.T) {
	boom := func() { panic("hook") }
	tests := []struct {
		name   string
		steps  []rht.Step
		method string
		policy Policy
		hook   func(Attempt)
		logger bool
		hedges int  // paid and sent, so kept
		alone  bool // no Limiter
	}{
		{"NewIdempotencyKey, with a Timeout", nil, "POST+panickey",
			Policy{Timeout: time.Minute}, nil, false, 0, true},
		{"Classify, with a Timeout", []rht.Step{rht.Status(503)}, "GET",
			Policy{Timeout: time.Minute, Classify: func(*http.Response, error) Class { boom(); return 0 }}, nil, false, 0, true},
		{"Classify, under AttemptTimeout", []rht.Step{rht.Status(503)}, "GET",
			Policy{AttemptTimeout: time.Second, Classify: func(*http.Response, error) Class { boom(); return 0 }}, nil, false, 0, true},
		{"Classify, with hedged copies in flight", []rht.Step{rht.Status(503).WithDelay(20 * time.Millisecond), rht.Status(200).WithDelay(time.Second)}, "GET",
			Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, MaxHedges: 2, Classify: func(*http.Response, error) Class { boom(); return 0 }}, nil, false, 0, true},
		{"OnAttempt, after a Retry decision", []rht.Step{rht.Status(503), rht.Status(200)}, "PUT",
			Policy{Timeout: time.Minute}, func(a Attempt) {
				if a.Decision == Retry {
					boom()
				}
			}, false, 0, true},
		{"OnAttempt, after a hedged attempt", []rht.Step{rht.Status(200).WithDelay(time.Second), rht.Status(200)}, "GET",
			Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}, func(Attempt) { boom() }, false, 0, true},
		{"Rand, with Timeout and AttemptTimeout", []rht.Step{rht.Status(503).WithBody("x")}, "PUT",
			Policy{Timeout: time.Minute, AttemptTimeout: time.Second, Rand: func(int64) int64 { boom(); return 0 }}, nil, false, 0, false},
		{"Logger handler, after a Retry under AttemptTimeout", []rht.Step{rht.Status(503).WithBody("x")}, "POST",
			Policy{AttemptTimeout: time.Second, Timeout: time.Minute}, nil, true, 0, false},
		{"GetBody for the retry", []rht.Step{rht.Status(503).WithBody("x")}, "PUT+panicbody",
			Policy{Timeout: time.Minute}, nil, false, 0, false},
		{"GetBody for the retry, hedged", []rht.Step{rht.Status(503).WithBody("x")}, "PUT+panicbody",
			Policy{Timeout: time.Minute, HedgeDelay: time.Second, HedgeRatio: 1}, nil, false, 0, false},
		{"NewIdempotencyKey, hedged", nil, "POST+panickey",
			Policy{HedgeDelay: time.Millisecond, HedgeRatio: 1, Timeout: time.Minute}, nil, false, 0, false},
		{"OnAttempt after a hedged retry", []rht.Step{rht.Status(503), rht.Status(200).WithDelay(time.Second), rht.Status(200)}, "GET",
			Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, Timeout: time.Minute, Rand: lowRand}, func(a Attempt) {
				if a.Number > 1 {
					boom()
				}
			}, false, 0, false}, // the hedge won: refunded before the hook
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.steps...)
				budget := newLedger(t)
				p := tc.policy
				method := tc.method
				if m, ok := strings.CutSuffix(method, "+panickey"); ok {
					method = m
					p.NewIdempotencyKey = func() string { boom(); return "" }
				}
				panicBody := false
				if m, ok := strings.CutSuffix(method, "+panicbody"); ok {
					method, panicBody = m, true
				}
				tr := &Transport{Base: base, Policy: p, OnAttempt: tc.hook, Budget: budget}
				if !tc.alone {
					tr.Limiter = &RateLimiter{}
				}
				if tc.logger {
					tr.Logger = slog.New(panicHandler{})
				}
				ctx := newWatchCtx()
				var closed, replays, replayed atomic.Int32
				req, _ := http.NewRequestWithContext(ctx, method, "http://example.test/", closeTracker{strings.NewReader("payload"), &closed})
				req.GetBody = func() (io.ReadCloser, error) {
					if panicBody {
						boom()
					}
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
				time.Sleep(time.Hour)
				synctest.Wait()
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
				budget.check(t)
				if got := budget.unsettled(); got != tc.hedges {
					t.Errorf("got %d payments kept; want %d (hedges sent)", got, tc.hedges)
				}
			})
		})
	}
}

// TestPlainPathAgreesWithTheLoop sends the same seeded random scripts
// through a Transport with nothing to set up, whose first attempt takes
// RoundTrip's plain path, and through one with an OnAttempt hook, which
// takes the loop from the start. Each request must end the same: the same
// status or error text, the same attempts at the base, the same tokens.
func TestPlainPathAgreesWithTheLoop(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for seed := range uint64(300) {
		rng := rand.New(rand.NewPCG(seed, 3))
		steps := make([]rht.Step, 1+rng.IntN(5))
		for i := range steps {
			switch rng.IntN(9) {
			case 0:
				steps[i] = rht.Step{Err: errReset}
			case 1:
				steps[i] = rht.Step{Err: context.Canceled}
			case 2:
				steps[i] = rht.RetryAfter(503, "1")
			case 3:
				steps[i] = rht.RetryAfter(429, "2")
			default:
				steps[i] = rht.Status([]int{200, 200, 404, 500, 502, 503}[rng.IntN(6)])
			}
		}
		p := Policy{MaxAttempts: 1 + rng.IntN(4), Rand: lowRand}
		tokens := []int{0, RetryCost, DefaultBudgetTokens}[rng.IntN(3)]
		method := []string{"GET", "PUT", "DELETE", "POST"}[rng.IntN(4)]
		ctx := context.Background()
		if rng.IntN(10) == 0 {
			ctx = canceled
		}
		type end struct {
			status   int
			err      string
			attempts int
			tokens   int
		}
		run := func(hooked bool) end {
			var e end
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(steps...)
				tr := &Transport{Base: base, Policy: p, Budget: newTokenBucket(tokens)}
				if hooked {
					tr.OnAttempt = func(Attempt) {}
				}
				e.status, _, _ = roundTrip(t, tr, newReq(t, method, "").WithContext(ctx))
				if _, err := tr.RoundTrip(newReq(t, method, "").WithContext(ctx)); err != nil {
					e.err = err.Error()
				}
				e.attempts, e.tokens = len(base.Attempts()), tr.budgetInUse().Available()
			})
			return e
		}
		if plain, loop := run(false), run(true); plain != loop {
			t.Errorf("seed %d (%s, %+v, %d tokens, steps %v): plain path %+v; loop %+v", seed, method, p, tokens, steps, plain, loop)
		}
	}
}
