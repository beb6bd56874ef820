package retryhttp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// randomBase answers each attempt as a random choice of the test's rng,
// honouring the request's context while it "works".
type randomBase struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (b *randomBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	b.mu.Lock()
	k := b.rng.IntN(9)
	delay := time.Duration(b.rng.IntN(4)) * 40 * time.Millisecond
	b.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-r.Context().Done():
			t.Stop()
			return nil, r.Context().Err()
		case <-t.C:
		}
	}
	mk := func(code int, h ...string) *http.Response {
		hd := http.Header{}
		for i := 0; i+1 < len(h); i += 2 {
			hd.Set(h[i], h[i+1])
		}
		return &http.Response{StatusCode: code, Header: hd, Body: io.NopCloser(strings.NewReader("x")), Request: r}
	}
	switch k {
	case 0, 1:
		return mk(200), nil
	case 2:
		return mk(503), nil
	case 3:
		return mk(503, "Retry-After", "1"), nil
	case 4:
		return mk(429, "Retry-After", "2"), nil
	case 5:
		return nil, errReset
	case 6:
		return nil, nil // broken base
	case 7:
		return mk(404), nil
	default:
		return mk(101), nil
	}
}

func TestOnEndSeesEveryEnd(t *testing.T) {
	canceled, cancelNow := context.WithCancel(context.Background())
	cancelNow()
	tests := []struct {
		name   string
		steps  []rht.Step
		method string
		policy Policy
		ctx    context.Context // nil: Background
		within time.Duration   // the request's deadline, if not 0
		cancel time.Duration   // when the request is canceled, if not 0
		paused bool            // the Limiter is paused for 2 s by another request's 429
		want   requestEnd
	}{
		{name: "success", steps: []rht.Step{rht.Status(200).WithDelay(10 * time.Millisecond)},
			want: requestEnd{Attempts: 1, Decision: Done}},
		{name: "retried to a success", steps: []rht.Step{rht.Status(503), rht.RetryAfter(503, "1"), rht.Status(200)},
			want: requestEnd{Attempts: 3, Decision: Done}},
		{name: "attempts exhausted", steps: []rht.Step{rht.Status(503).Times(3)},
			want: requestEnd{Attempts: 3, Decision: StopAttempts}},
		{name: "not retryable", steps: []rht.Step{rht.Status(404)},
			want: requestEnd{Attempts: 1, Decision: Done}},
		{name: "an unkeyed write's error", steps: []rht.Step{{Err: errReset}}, method: "POST", policy: Policy{NewIdempotencyKey: noKey},
			want: requestEnd{Attempts: 1, Decision: StopNotIdempotent}},
		{name: "canceled in the wait for a retry", steps: []rht.Step{rht.RetryAfter(503, "5")},
			cancel: time.Second,
			want:   requestEnd{Attempts: 1, Decision: StopCanceled, Abandoned: true}},
		{name: "canceled before its first attempt", steps: []rht.Step{rht.Status(200)}, ctx: canceled,
			want: requestEnd{Decision: StopCanceled, Abandoned: true}},
		{name: "no permit for its first attempt", steps: []rht.Step{rht.Status(200)}, paused: true, within: time.Second,
			want: requestEnd{Decision: StopRateLimited, Abandoned: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var lim *RateLimiter
				if tt.paused {
					lim = &RateLimiter{}
					other := &Transport{Base: rht.NewTransport(rht.RetryAfter(429, "2")), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
					roundTrip(t, other, newReq(t, "GET", ""))
				}
				var (
					seen  []string // the hooks, in the order they ran
					ends  []requestEnd
					attem []Attempt
				)
				tt.policy.Rand = lowRand
				tr := &Transport{Base: rht.NewTransport(tt.steps...), Policy: tt.policy, Limiter: lim,
					OnAttempt: func(a Attempt) { seen = append(seen, "attempt"); attem = append(attem, a) },
					OnEnd:     func(r *http.Request, e Report) { seen = append(seen, "end"); ends = append(ends, endOf(r, e)) }}
				method := cmp.Or(tt.method, "GET")
				req := newReq(t, method, "x")
				ctx := cmp.Or(tt.ctx, context.Background())
				if tt.within > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.within)
					defer cancel()
				}
				if tt.cancel > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					time.AfterFunc(tt.cancel, cancel)
				}
				req = req.WithContext(ctx)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				took := time.Since(start)
				if resp != nil {
					resp.Body.Close()
				}
				if len(ends) != 1 {
					t.Fatalf("OnEnd called %d times; want 1", len(ends))
				}
				got := ends[0]
				checkEnd(t, got, attem, req, resp, err, took)
				got.Request, got.Err, got.Duration = nil, nil, 0
				if got != tt.want {
					t.Errorf("got %+v; want %+v", got, tt.want)
				}
				if want := append(slices.Repeat([]string{"attempt"}, len(attem)), "end"); !slices.Equal(seen, want) {
					t.Errorf("hooks ran %v; want %v", seen, want)
				}
				if got.Abandoned && len(attem) > 0 && attem[len(attem)-1].Decision != Retry {
					t.Errorf("abandoned after an attempt that decided %v; want Retry", attem[len(attem)-1].Decision)
				}
			})
		})
	}
}

// requestEnd is what OnEnd received: the request, and its Report without
// History, which OnEnd never sees.
type requestEnd struct {
	Request   *http.Request
	Attempts  int
	Decision  Decision
	Abandoned bool
	Err       error
	Duration  time.Duration
}

func endOf(req *http.Request, r Report) requestEnd {
	return requestEnd{req, r.Attempts, r.Decision, r.Abandoned, r.Err, r.Duration}
}

// checkEnd checks what OnEnd got against what RoundTrip, called with req,
// returned after took: the caller's request, the same error's cause (an
// *Error whose decision and attempts it repeats), the duration, and the
// last attempt's status, the response's.
func checkEnd(t *testing.T, e requestEnd, attempts []Attempt, req *http.Request, resp *http.Response, err error, took time.Duration) {
	t.Helper()
	if e.Request != req {
		t.Errorf("got Request %p; want the caller's %p", e.Request, req)
	}
	var cause error
	if re := (*Error)(nil); errors.As(err, &re) {
		cause = re.Err
	}
	if e.Err != cause {
		t.Errorf("got Err %v; want the cause of RoundTrip's %v", e.Err, err)
	}
	if resp != nil && (len(attempts) == 0 || attempts[len(attempts)-1].Status != resp.StatusCode) {
		t.Errorf("got attempts %v; want the last with the returned response's status (%v)", attempts, resp)
	}
	if e.Duration != took {
		t.Errorf("got Duration %v; want %v", e.Duration, took)
	}
	var re *Error
	if err != nil && (!errors.As(err, &re) || re.Decision != e.Decision || re.Attempts != e.Attempts) {
		t.Errorf("got %+v with error %v; want the error's decision and attempts", e, err)
	}
}

// TestOnEndAgreesWithRoundTrip runs many random requests through random
// Transport setups and checks, for each, that OnEnd is called once, after
// the last OnAttempt, and agrees with what RoundTrip returned and with the
// last OnAttempt.
func TestOnEndAgreesWithRoundTrip(t *testing.T) {
	for seed := uint64(0); seed < 300; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 7))
				base := &randomBase{rng: rand.New(rand.NewPCG(seed, 9))}
				p := Policy{Rand: lowRand}
				if rng.IntN(2) == 0 {
					p.HedgeDelay, p.HedgeRatio = 50*time.Millisecond, 1
				}
				if rng.IntN(3) == 0 {
					p.AttemptTimeout = 70 * time.Millisecond
				}
				if rng.IntN(3) == 0 {
					p.Timeout = time.Duration(1+rng.IntN(3)) * time.Second
				}
				if rng.IntN(3) == 0 {
					p.MaxAttempts = 5
				}
				var lim *RateLimiter
				var ph *PerHost
				switch rng.IntN(3) {
				case 0:
					lim = &RateLimiter{MaxWait: 300 * time.Millisecond}
				case 1:
					ph = &PerHost{}
				}
				var seen []string
				var atts []Attempt
				var ends []requestEnd
				tr := &Transport{Base: base, Policy: p, Limiter: lim, PerHost: ph,
					OnAttempt: func(a Attempt) { seen = append(seen, "a"); atts = append(atts, a) },
					OnEnd:     func(r *http.Request, e Report) { seen = append(seen, "e"); ends = append(ends, endOf(r, e)) }}
				for i := 0; i < 20; i++ {
					seen, atts, ends = nil, nil, nil
					method := "GET"
					if rng.IntN(3) == 0 {
						method = "POST"
					}
					req := newReq(t, method, "body")
					ctx := context.Background()
					var cancel context.CancelFunc = func() {}
					switch rng.IntN(4) {
					case 0:
						ctx, cancel = context.WithCancel(ctx)
						time.AfterFunc(time.Duration(rng.IntN(3000))*time.Millisecond, cancel)
					case 1:
						ctx, cancel = context.WithTimeout(ctx, time.Duration(rng.IntN(3000))*time.Millisecond)
					}
					req = req.WithContext(ctx)
					start := time.Now()
					resp, err := tr.RoundTrip(req)
					took := time.Since(start)
					if resp != nil {
						resp.Body.Close()
					}
					cancel()
					if len(ends) != 1 {
						t.Fatalf("req %d: OnEnd called %d times; want 1 (err %v)", i, len(ends), err)
					}
					if seen[len(seen)-1] != "e" {
						t.Errorf("req %d: hooks ran %v; want OnEnd last", i, seen)
					}
					e := ends[0]
					checkEnd(t, e, atts, req, resp, err, took)
					if len(atts) > 0 {
						last := atts[len(atts)-1]
						if last.Number+last.Hedges != e.Attempts {
							t.Errorf("req %d: Attempts %d; last attempt %d with %d hedges", i, e.Attempts, last.Number, last.Hedges)
						}
						if e.Abandoned && last.Decision != Retry {
							t.Errorf("req %d: abandoned after %v", i, last.Decision)
						}
						if !e.Abandoned && last.Decision != e.Decision {
							t.Errorf("req %d: end decision %v; last attempt's %v", i, e.Decision, last.Decision)
						}
						if last.Decision == Retry && !e.Abandoned {
							t.Errorf("req %d: last attempt said Retry, end not abandoned: %+v", i, e)
						}
					} else {
						if e.Attempts != 0 || !e.Abandoned {
							t.Errorf("req %d: no attempt, end %+v", i, e)
						}
					}
				}
			})
		})
	}
}

// A panicking OnEnd on each way out leaves nothing open or spent: the
// response bodies, the request body, the Timeout, a retry's tokens.
func TestPanickingOnEndAtEveryExit(t *testing.T) {
	tests := []struct {
		name   string
		steps  []rht.Step
		cancel bool // the context is canceled before RoundTrip
		inWait bool // canceled in the wait for a retry
		hedge  bool
		spent  int // tokens the retries spent
	}{
		{name: "canceled before", steps: []rht.Step{rht.Status(200)}, cancel: true},
		{name: "canceled in the wait", steps: []rht.Step{rht.RetryAfter(503, "5")}, inWait: true},
		{name: "attempts exhausted", steps: []rht.Step{rht.Status(503).Times(3)}, spent: 2 * RetryCost},
		{name: "hedged, a copy wins", steps: []rht.Step{rht.Status(200).WithDelay(time.Second), rht.Status(200)}, hedge: true},
		{name: "error", steps: []rht.Step{{Err: errReset}, {Err: errReset}, {Err: errReset}}, spent: 2 * RetryCost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.steps...)
				var ctxs []context.Context
				var mu sync.Mutex
				p := Policy{Timeout: time.Minute, Rand: lowRand}
				if tc.hedge {
					p.HedgeDelay, p.HedgeRatio = 100*time.Millisecond, 1
				}
				tr := &Transport{Policy: p, OnEnd: func(*http.Request, Report) { panic("end") }}
				tr.Base = roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					mu.Lock()
					ctxs = append(ctxs, r.Context())
					mu.Unlock()
					return base.RoundTrip(r)
				})
				var closes atomic.Int32
				req := newReq(t, "PUT", "payload")
				req.Body = closeTracker{strings.NewReader("payload"), &closes}
				req.GetBody = func() (io.ReadCloser, error) {
					return closeTracker{strings.NewReader("payload"), &closes}, nil
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.cancel {
					cancel()
				}
				if tc.inWait {
					tr.OnAttempt = func(a Attempt) {
						if a.Decision == Retry {
							time.AfterFunc(time.Second, cancel)
						}
					}
				}
				req = req.WithContext(ctx)
				func() {
					defer func() {
						if r := recover(); r != "end" {
							t.Errorf("got panic %v; want OnEnd's", r)
						}
					}()
					tr.RoundTrip(req)
				}()
				synctest.Wait()
				time.Sleep(10 * time.Second)
				synctest.Wait()
				if got := base.OpenBodies(); got != 0 {
					t.Errorf("got %d open response bodies; want 0", got)
				}
				if tc.cancel && closes.Load() != 1 {
					t.Errorf("request body closed %d times; want 1", closes.Load())
				}
				for i, c := range ctxs {
					if c.Err() == nil {
						t.Errorf("attempt %d's context still running", i+1)
					}
				}
				if got, want := tr.budgetInUse().Available(), DefaultBudgetTokens-tc.spent; got < want-1 || got > want {
					t.Errorf("got %d tokens; want %d (up to 1 fewer: failures deposit nothing)", got, want)
				}
			})
		})
	}
}
