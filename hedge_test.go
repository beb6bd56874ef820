package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestHedging(t *testing.T) {
	// Hedged after 10ms; the hedge share is whole for each request here
	// (HedgeRatio 1) unless a case says otherwise; a hedge the share cannot
	// pay for is asked for again every quarter of the delay. Hedges never
	// touch the retry budget.
	slow := func(code int) rht.Step { return rht.Status(code).WithDelay(196 * time.Millisecond).WithBody("slow") }
	fast := rht.Status(200).WithBody("fast")
	tests := []struct {
		name     string
		steps    []rht.Step
		method   string
		policy   Policy
		took     time.Duration
		body     string
		attempts int
		hedges   int
		won      bool
		refused  int
	}{
		{"a slow copy: the hedge wins", []rht.Step{slow(200), fast}, "GET", Policy{HedgeRatio: 1},
			10 * time.Millisecond, "fast", 2, 1, true, 0},
		{"slow for everyone: the first copy wins", []rht.Step{slow(200)}, "GET", Policy{HedgeRatio: 1},
			196 * time.Millisecond, "slow", 2, 1, false, 0},
		{"the share holds half a hedge: none, asked for at 10ms, then every 2.5ms", []rht.Step{slow(200)}, "GET", Policy{HedgeRatio: 0.5},
			196 * time.Millisecond, "slow", 1, 0, false, 75},
		{"the default share starts empty", []rht.Step{slow(200)}, "GET", Policy{},
			196 * time.Millisecond, "slow", 1, 0, false, 75},
		{"two hedges allowed", []rht.Step{slow(200), slow(200), fast}, "GET", Policy{HedgeRatio: 2, MaxHedges: 2},
			20 * time.Millisecond, "fast", 3, 2, true, 0},
		{"a second hedge the share cannot pay for", []rht.Step{slow(200), slow(200), fast}, "GET", Policy{HedgeRatio: 1, MaxHedges: 2},
			196 * time.Millisecond, "slow", 2, 1, false, 71},
		{"hedges count against MaxAttempts", []rht.Step{slow(200), slow(200), fast}, "GET", Policy{HedgeRatio: 5, MaxHedges: 5, MaxAttempts: 2},
			196 * time.Millisecond, "slow", 2, 1, false, 0},
		{"a keyless POST is never hedged", []rht.Step{slow(200), fast}, "POST", Policy{HedgeRatio: 1, NewIdempotencyKey: noKey},
			196 * time.Millisecond, "slow", 1, 0, false, 0},
		// A server that deduplicates keys answers a copy sent while another
		// is in progress with 409, which would win the race.
		{"a keyed POST is not hedged", []rht.Step{slow(201), rht.Status(201).WithBody("fast")}, "POST", Policy{HedgeRatio: 1},
			196 * time.Millisecond, "slow", 1, 0, false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.steps...)
				p := tc.policy
				p.HedgeDelay = 10 * time.Millisecond
				budget := newTokenBucket(500)
				var hooks []Attempt
				tr := &Transport{Base: base, Policy: p, Budget: budget, OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
				start := time.Now()
				_, body, err := roundTrip(t, tr, newReq(t, tc.method, "payload"))
				if err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); took != tc.took || body != tc.body {
					t.Errorf("got %q after %v; want %q after %v", body, took, tc.body, tc.took)
				}
				rht.AssertAttempts(t, base, tc.attempts)
				if a := hooks[len(hooks)-1]; a.Hedges != tc.hedges || a.HedgeWon != tc.won || a.HedgesRefused != tc.refused {
					t.Errorf("got %d hedges (won %v, %d refused); want %d (won %v, %d refused)", a.Hedges, a.HedgeWon, a.HedgesRefused, tc.hedges, tc.won, tc.refused)
				}
				if got := budget.Available(); got != 500 {
					t.Errorf("got %d tokens; want 500 (hedges are not paid from the budget)", got)
				}
				synctest.Wait() // losers are drained on goroutines of their own
				if got := base.OpenBodies(); got != 0 {
					t.Errorf("got %d response bodies open; want 0 (the losers drained and closed)", got)
				}
				if tc.method == "POST" && tc.attempts > 1 {
					rht.AssertStableKey(t, base)
					for i, a := range base.Attempts() {
						if a.Body != "payload" {
							t.Errorf("copy %d: got body %q; want payload", i+1, a.Body)
						}
					}
				}
			})
		})
	}
}

func TestFirstAskLeavesAHedgeForTheSlowest(t *testing.T) {
	// At the default ratio (5%), the first ask for a hedge, at the delay
	// (10ms), takes one only if the share still holds 0.95 of a hedge after
	// it; asked again a quarter of the delay later (12.5ms), the copy
	// takes the last one. The request adds its 0.05 to what the share held.
	tests := []struct {
		name    string
		held    int64 // millionths of a hedge in the share before the request
		took    time.Duration
		body    string
		hedges  int
		refused int
	}{
		{"1.95 hedges: hedged at the delay", 1_900_000, 10 * time.Millisecond, "fast", 1, 0},
		{"1.949999 hedges: hedged when asked again", 1_899_999, 12500 * time.Microsecond, "fast", 1, 1},
		{"1 hedge: hedged when asked again", 950_000, 12500 * time.Microsecond, "fast", 1, 1},
		{"0.999999 of a hedge: never", 949_999, 196 * time.Millisecond, "slow", 0, 75},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(rht.Status(200).WithDelay(196*time.Millisecond).WithBody("slow"), rht.Status(200).WithBody("fast"))
				var last Attempt
				tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond}, OnAttempt: func(a Attempt) { last = a }}
				tr.hedges.get().quota.units.Store(tc.held * (hedgeUnit / 1_000_000))
				start := time.Now()
				_, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
				if err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); took != tc.took || body != tc.body {
					t.Errorf("got %q after %v; want %q after %v", body, took, tc.body, tc.took)
				}
				if last.Hedges != tc.hedges || last.HedgesRefused != tc.refused {
					t.Errorf("got %d hedges, %d refused; want %d, %d", last.Hedges, last.HedgesRefused, tc.hedges, tc.refused)
				}
				synctest.Wait()
			})
		})
	}
}

func TestHedgeThenRetry(t *testing.T) {
	// Both copies of the first attempt fail with 503: the retry logic takes
	// over, with backoff, for the attempt left.
	synctest.Test(t, func(t *testing.T) {
		slow503 := rht.Status(503).WithDelay(50 * time.Millisecond)
		base := rht.NewTransport(slow503, slow503, rht.Status(200))
		var rep Report
		req := newReq(t, "GET", "")
		req = req.WithContext(WithReport(req.Context(), &rep))
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, Rand: lowRand}}
		code, _, err := roundTrip(t, tr, req)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200", code, err)
		}
		rht.AssertAttempts(t, base, 3)
		if len(rep.History) != 2 || rep.History[0].Hedges != 1 || rep.History[1].Number != 3 {
			t.Errorf("got attempts %v; want a hedged first attempt (copies 1 and 2), then attempt 3", rep.History)
		}
	})
}

func TestHedgeWinnerDoesNotWaitForALoser(t *testing.T) {
	// The first copy's base ignores its canceled context and answers an hour
	// later; the hedge answers at once. The winner comes back at once, and
	// the loser's answer is closed when it comes.
	synctest.Test(t, func(t *testing.T) {
		var calls, closed atomic.Int32
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				time.Sleep(time.Hour)
				return &http.Response{StatusCode: 200, Body: closeTracker{strings.NewReader("late"), &closed}}, nil
			}
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("fast"))}, nil
		})
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}}
		start := time.Now()
		_, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if took := time.Since(start); err != nil || body != "fast" || took != 10*time.Millisecond {
			t.Fatalf("got (%q, %v) after %v; want \"fast\" after 10ms", body, err, took)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if got := closed.Load(); got != 1 {
			t.Errorf("got the loser's body closed %d times; want 1", got)
		}
	})
}

func TestHedgeCarriesItsOwnAttemptNumber(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(200).WithDelay(50*time.Millisecond), rht.Status(200))
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, SendAttemptHeader: true}}
		if _, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil {
			t.Fatal(err)
		}
		for i, a := range base.Attempts() {
			if got, want := a.Header.Get(attemptHeader), strconv.Itoa(i+1); got != want {
				t.Errorf("copy %d: got %s %q; want %q", i+1, attemptHeader, got, want)
			}
		}
	})
}

func TestThrottledLoserReachesTheLimiter(t *testing.T) {
	// The first copy is answered 429 while its hedge is still running; the
	// hedge wins. The 429 is a throttle all the same: the limiter cuts.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(429).WithDelay(20*time.Millisecond), rht.Status(200).WithDelay(20*time.Millisecond))
		lim := &RateLimiter{}
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want the hedge's 200", code, err)
		}
		if got := lim.Stats().Cuts; got != 1 {
			t.Errorf("got %d cuts; want 1 (the losing copy's 429)", got)
		}
	})
}

func TestHedgeCanceledByTheCallerWinsNothing(t *testing.T) {
	// The caller cancels while both copies run; the hedge's base gives up
	// at once, the first copy's much later. The hedge's error comes first,
	// but a copy canceled by the caller won nothing: its tokens stay spent.
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				time.Sleep(time.Hour)
				return nil, context.Canceled
			}
			<-r.Context().Done()
			return nil, r.Context().Err()
		})
		budget := newTokenBucket(500)
		var hooks []Attempt
		tr := &Transport{Base: base, Budget: budget, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1},
			OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		time.AfterFunc(20*time.Millisecond, cancel)
		_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopCanceled {
			t.Fatalf("got %v; want StopCanceled", err)
		}
		if a := hooks[len(hooks)-1]; a.Hedges != 1 || a.HedgeWon {
			t.Errorf("got %d hedges, won %v; want 1 hedge, not won", a.Hedges, a.HedgeWon)
		}
		if got := budget.Available(); got != 500 {
			t.Errorf("got %d tokens; want 500 (hedges are not paid from the budget)", got)
		}
		time.Sleep(time.Hour) // the first copy's base gives up too
	})
}

func TestReportUnderNestedHedging(t *testing.T) {
	// An outer Transport hedges over an inner one; both write to the
	// request's Report. The inner Transport runs on the copies' goroutines,
	// each with a Report of its own: the loser, still running when the
	// winner returns, keeps its attempts to itself.
	inner := &Transport{Base: rht.NewTransport(rht.Status(200).WithDelay(30*time.Millisecond), rht.Status(200))}
	outer := &Transport{Base: inner, Policy: Policy{HedgeDelay: 5 * time.Millisecond, HedgeRatio: 1}}
	for range 20 {
		var rep Report
		req := newReq(t, "GET", "")
		req = req.WithContext(WithReport(req.Context(), &rep))
		if _, _, err := roundTrip(t, outer, req); err != nil {
			t.Fatal(err)
		}
		if len(rep.History) != 2 || rep.Decision != Done {
			t.Fatalf("got %d attempts, %v; want 2 (the winning copy's inner attempt, then the outer one), done", len(rep.History), rep.Decision)
		}
	}
}

func TestHedgesTakePermits(t *testing.T) {
	// While limiting, a hedge is sent only under a permit due when it is:
	// it never waits for one, nor pushes the other attempts back. At 7/s,
	// a permit every 1/7 s: a hedge due 10ms after its first copy finds
	// none, and is asked for again every 2.5ms until one is due; one due
	// after 500ms finds one at once.
	for _, delay := range []time.Duration{10 * time.Millisecond, 500 * time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := &RateLimiter{}
				holdAt(lim, 7, time.Hour) // limiting at 7/s, a permit due now
				base := rht.NewTransport(rht.Status(200).WithDelay(time.Second).WithBody("slow"), rht.Status(200).WithBody("fast"))
				var hooks []Attempt
				tr := &Transport{Base: base, Limiter: lim, Policy: Policy{HedgeDelay: delay, HedgeRatio: 1},
					OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
				start := time.Now()
				iv := seventh // the slot the first copy takes
				_, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
				refused, reask := 0, delay/4 // asked at delay, then every quarter of it
				if delay < iv {
					refused = int((iv - delay + reask - 1) / reask)
				}
				took := delay + time.Duration(refused)*reask
				if err != nil || body != "fast" || time.Since(start) != took {
					t.Fatalf("got (%q, %v) after %v; want the hedge's \"fast\" after %v", body, err, time.Since(start), took)
				}
				if a := hooks[len(hooks)-1]; a.Hedges != 1 || a.HedgesRefused != refused {
					t.Errorf("got %d hedges, %d refused; want 1, %d", a.Hedges, a.HedgesRefused, refused)
				}
				time.Sleep(time.Second) // the first copy, canceled, lets go
			})
		})
	}
}

// A hedged PUT's GetBody panics while its hedge is prepared, after the hedge
// took a permit and its tokens: the panic reaches the caller, and the hedge,
// never sent, gives both back.
func TestHedgeGetBodyPanicLeavesNothingTaken(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Make the limiter limit: one 429, then wait a second so a permit
		// is due for the first copy and the hedge finds one too.
		lim := &RateLimiter{}
		first := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, first, newReq(t, "GET", ""))
		time.Sleep(time.Second)

		budget := newLedger(t)
		base := rht.NewTransport(rht.Status(200).WithDelay(time.Second))
		tr := &Transport{Base: base, Budget: budget, Limiter: lim, Policy: Policy{HedgeDelay: 500 * time.Millisecond, HedgeRatio: 1}}
		req := newReq(t, "PUT", "payload")
		req.GetBody = func() (io.ReadCloser, error) { panic("GetBody") }
		func() {
			defer func() {
				if recover() == nil {
					t.Error("got no panic; want GetBody's panic to reach the caller")
				}
			}()
			tr.RoundTrip(req)
		}()
		synctest.Wait()
		budget.check(t)
		if n := budget.unsettled(); n != 0 {
			t.Errorf("got %d Tokens paid for a hedge that was never sent and never refunded; want 0", n)
		}
		rht.AssertAttempts(t, base, 1) // only the first copy went out
		if _, ok := lim.reserve(time.Now(), time.Now(), 0, false); !ok {
			t.Error("the limiter has no permit due now; want one (the unsent hedge's slot given back)")
		}
	})
}

// The first copy answers 503 with a body that stalls while the hedge still
// runs; the hedge's 200 comes at 20ms and is returned then. A losing answer is
// drained off the caller's goroutine, and closed within drainTimeout.
func TestHedgeWinnerDoesNotWaitForALosersDrain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls, closed atomic.Int32
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				time.Sleep(15 * time.Millisecond)
				return &http.Response{StatusCode: 503, Header: http.Header{}, Body: newStallBody(&closed), Request: r}, nil
			}
			time.Sleep(10 * time.Millisecond) // answers at 20ms
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("hedge")), Request: r}, nil
		})
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}}
		start := time.Now()
		_, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || body != "hedge" {
			t.Fatalf("got (%q, %v); want the hedge's answer", body, err)
		}
		if took := time.Since(start); took != 20*time.Millisecond {
			t.Errorf("the winner came back after %v; want 20ms (it waited %v for the loser's drain)", took, took-20*time.Millisecond)
		}
		time.Sleep(drainTimeout) // the loser's drain, on its own goroutine, gives up on the stalled body
		synctest.Wait()
		if got := closed.Load(); got != 1 {
			t.Errorf("got the loser's body closed %d times; want 1", got)
		}
	})
}

// The first copy wins at 20ms and Classify peeks at its body for 5ms;
// meanwhile the hedge answers with a body that stalls. The winner comes back
// at 25ms: answers already sent when the race ends are drained off the
// caller's goroutine.
func TestHedgeLosersDrainOffTheCallersGoroutine(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls, closed atomic.Int32
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				time.Sleep(20 * time.Millisecond)
				return &http.Response{StatusCode: 200, Header: http.Header{}, Request: r,
					Body: &slowStartBody{r: strings.NewReader("first"), d: 5 * time.Millisecond}}, nil
			}
			time.Sleep(12 * time.Millisecond) // launched at 10ms: answers at 22ms
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: newStallBody(&closed), Request: r}, nil
		})
		classify := func(resp *http.Response, err error) Class {
			PeekBody(resp, 16)
			return DefaultClassify(resp, err)
		}
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, Classify: classify}}
		start := time.Now()
		_, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || body != "first" {
			t.Fatalf("got (%q, %v); want the first copy's answer", body, err)
		}
		if took := time.Since(start); took != 25*time.Millisecond {
			t.Errorf("the winner came back after %v; want 25ms (20ms, then 5ms of peeking)", took)
		}
		time.Sleep(drainTimeout) // the loser's drain, on its own goroutine, gives up on the stalled body
		synctest.Wait()
		if got := closed.Load(); got != 1 {
			t.Errorf("got the loser's body closed %d times; want 1", got)
		}
	})
}

// Hedging on both levels of nested Transports, with
// a Report: the Report holds the winning outer copy's inner attempts (its
// own winning copy merged in) followed by the outer attempt, and Done.
func TestReportUnderHedgingOnBothLevels(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Outer copy 1 -> inner copies 1 (slow) and 2 (slow); outer copy 2
		// (at 5ms) -> inner copies 3 (fast 503) then a retry 4 (200).
		var calls atomic.Int32
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			n := calls.Add(1)
			d, code := time.Duration(0), 200
			switch n {
			case 1, 2:
				d = time.Hour
			case 3:
				code = 503
			}
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		inner := &Transport{Base: base, Policy: Policy{HedgeDelay: 3 * time.Millisecond, HedgeRatio: 1, Rand: lowRand}}
		outer := &Transport{Base: inner, Policy: Policy{HedgeDelay: 5 * time.Millisecond, HedgeRatio: 1}}
		var rep Report
		req := newReq(t, "GET", "")
		req = req.WithContext(WithReport(req.Context(), &rep))
		if code, _, err := roundTrip(t, outer, req); err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200", code, err)
		}
		var got []string
		for _, a := range rep.History {
			got = append(got, fmt.Sprintf("%d:%d:%v", a.Number, a.Status, a.Decision))
		}
		want := []string{"1:503:retry", "2:200:done", "1:200:done"}
		if fmt.Sprint(got) != fmt.Sprint(want) || rep.Decision != Done {
			t.Errorf("got %v, %v; want %v, done", got, rep.Decision, want)
		}
		time.Sleep(2 * time.Hour)
	})
}

func TestAttemptTimeoutWhereNoHedgeCanCome(t *testing.T) {
	// AttemptTimeout gives way to the hedge delay only on an attempt that
	// may be hedged. The last attempt MaxAttempts allows, and an attempt
	// made before HedgeQuantile has a delay, are cut off by it.
	tests := []struct {
		name   string
		steps  []rht.Step
		policy Policy
		want   error // nil: a 200
		took   time.Duration
	}{
		{"HedgeQuantile before its first estimate", []rht.Step{rht.Hang().Times(1), rht.Status(200)},
			Policy{HedgeQuantile: 0.95}, nil, time.Second},
		{"the last attempt, with HedgeDelay", []rht.Step{rht.Status(503).Times(1), rht.Hang()},
			Policy{MaxAttempts: 2, HedgeDelay: 10 * time.Millisecond}, ErrAttemptTimeout, time.Second},
		{"the last attempt, with HedgeQuantile", []rht.Step{rht.Status(503).Times(1), rht.Hang()},
			Policy{MaxAttempts: 2, HedgeQuantile: 0.95}, ErrAttemptTimeout, time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := tc.policy
				p.AttemptTimeout, p.HedgeRatio, p.Rand = time.Second, 1, lowRand
				tr := &Transport{Base: rht.NewTransport(tc.steps...), Policy: p}
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://a.test/", nil)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				took := time.Since(start)
				if err == nil {
					resp.Body.Close()
				}
				if !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) || took != tc.took {
					t.Errorf("got %v after %v; want %v after %v", err, took, tc.want, tc.took)
				}
			})
		})
	}
}

func TestHangingDependencyGetsAHedgeDelay(t *testing.T) {
	// Attempts ended by AttemptTimeout count toward HedgeQuantile's
	// estimate as that long: after twenty, a dependency that hangs gets a
	// delay, and its attempts are hedged. The delay is past the
	// AttemptTimeout the samples ran for, so the request that shows the
	// hedge allows its attempts longer (an Override).
	synctest.Test(t, func(t *testing.T) {
		var last Attempt
		tr := &Transport{Base: rht.NewTransport(rht.Hang()), OnAttempt: func(a Attempt) { last = a },
			Policy: Policy{MaxAttempts: 2, AttemptTimeout: time.Second, HedgeQuantile: 0.5, HedgeRatio: 1, Rand: lowRand}}
		for i := range 11 {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			if i == 10 {
				ctx = WithOverride(ctx, Override{AttemptTimeout: 5 * time.Second})
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://a.test/", nil)
			if _, err := tr.RoundTrip(req); err == nil {
				t.Fatalf("request %d: got no error; want one", i+1)
			}
			cancel()
			if want := map[bool]int{true: 1}[i == 10]; last.Hedges != want {
				t.Errorf("request %d: got %d hedges; want %d", i+1, last.Hedges, want)
			}
		}
		synctest.Wait()
	})
}

func TestLoneLastAttemptAfterAHedgedOne(t *testing.T) {
	// A hedged first attempt whose two copies fail, then the last attempt
	// MaxAttempts allows, sent alone (no room for a hedge): it reports no
	// hedges, and Error.Attempts is the 3 attempts the base saw.
	tests := []struct {
		name   string
		policy Policy
	}{
		{"HedgeDelay", Policy{HedgeDelay: 10 * time.Millisecond}},
		{"HedgeQuantile, a delay known", Policy{HedgeQuantile: 0.5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := tc.policy
				p.MaxAttempts, p.HedgeRatio, p.Rand = 3, 1, lowRand
				slow503 := rht.Status(503).WithDelay(50 * time.Millisecond)
				steps := []rht.Step{rht.Status(200).WithDelay(time.Millisecond).Times(20), slow503.Times(2), rht.Reset()}
				base := rht.NewTransport(steps...)
				var hooks []Attempt
				tr := &Transport{Base: base, Policy: p, OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
				for range 20 { // a delay for HedgeQuantile
					if _, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil {
						t.Fatal(err)
					}
				}
				synctest.Wait()
				hooks = nil
				var rep Report
				req := newReq(t, "GET", "")
				req = req.WithContext(WithReport(req.Context(), &rep))
				_, err := tr.RoundTrip(req)
				var re *Error
				if !errors.As(err, &re) {
					t.Fatalf("got %v; want an *Error", err)
				}
				synctest.Wait()
				if got := len(base.Attempts()) - 20; got != 3 {
					t.Fatalf("the base saw %d attempts; want 3", got)
				}
				if re.Attempts != 3 {
					t.Errorf("Error.Attempts: got %d; want 3 (the attempts made)", re.Attempts)
				}
				if len(hooks) != 2 || hooks[0].Hedges != 1 || hooks[1].Number != 3 || hooks[1].Hedges != 0 {
					var s []string
					for _, a := range hooks {
						s = append(s, fmt.Sprintf("#%d hedges=%d refused=%d", a.Number, a.Hedges, a.HedgesRefused))
					}
					t.Errorf("OnAttempt: got %v; want [#1 hedges=1, #3 hedges=0]", s)
				}
				if len(rep.History) == 2 && rep.History[1].Hedges != 0 {
					t.Errorf("Report: the last attempt says %d hedges; want 0", rep.History[1].Hedges)
				}
			})
		})
	}
}

func TestLoneLastAttemptHasNoRefusedHedges(t *testing.T) {
	// The first attempt's hedge is refused (a share of half a hedge) again
	// and again; the last attempt, sent alone, reports none refused.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(503).WithDelay(50*time.Millisecond).Times(1), rht.Status(503))
		var hooks []Attempt
		tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 2, HedgeDelay: 10 * time.Millisecond, HedgeRatio: 0.5, Rand: lowRand},
			OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		roundTrip(t, tr, newReq(t, "GET", ""))
		if len(hooks) != 2 || hooks[1].HedgesRefused != 0 {
			t.Errorf("got %d attempts, the last with %d refused hedges; want 2, the last with 0 (it was never hedged)", len(hooks), hooks[len(hooks)-1].HedgesRefused)
		}
	})
}

func TestHedgingUnderConcurrency(t *testing.T) {
	// Many goroutines, HedgeQuantile per destination, random latencies and
	// caller cancellations, a Limiter, a Report each, under -race: every
	// request returns a response or an error, not both, and no goroutine
	// is left.
	synctest.Test(t, func(t *testing.T) {
		var seq atomic.Uint64
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			n := seq.Add(1)
			rng := rand.New(rand.NewPCG(n, 3))
			d := time.Duration(rng.IntN(20)) * time.Millisecond
			if rng.IntN(10) == 0 {
				d = time.Second
			}
			code := 200
			switch rng.IntN(8) {
			case 0:
				code = 503
			case 1:
				code = 429
			}
			if rng.IntN(3) == 0 { // ignores cancellation
				time.Sleep(d)
				return &http.Response{StatusCode: code, Body: http.NoBody, Request: r}, nil
			}
			select {
			case <-time.After(d):
				return &http.Response{StatusCode: code, Body: http.NoBody, Request: r}, nil
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
		})
		tr := &Transport{Base: base, PerHost: &PerHost{MaxHosts: 3, IdleTimeout: 50 * time.Millisecond,
			Limiter: func(string) *RateLimiter { return &RateLimiter{} }},
			Policy: Policy{HedgeQuantile: 0.5, HedgeRatio: 2, MaxHedges: 2, MaxAttempts: 4, AttemptTimeout: 300 * time.Millisecond, MaxServerDelay: -1}}
		done := make(chan struct{})
		for g := range 8 {
			go func() {
				defer func() { done <- struct{}{} }()
				rng := rand.New(rand.NewPCG(uint64(g), 9))
				for i := range 150 {
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(4) == 0 {
						time.AfterFunc(time.Duration(rng.IntN(30))*time.Millisecond, cancel)
					}
					var rep Report
					ctx = WithReport(ctx, &rep)
					hosts := []string{"a.test", "A.test", "b.test:080", "c.test", "d.test"}
					req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+hosts[(g+i)%len(hosts)]+"/", nil)
					resp, err := tr.RoundTrip(req)
					if (resp == nil) == (err == nil) {
						t.Errorf("got (%v, %v); want a response xor an error", resp, err)
					}
					if resp != nil {
						resp.Body.Close()
					}
					cancel()
				}
			}()
		}
		for range 8 {
			<-done
		}
		time.Sleep(time.Hour)
	})
}

func TestClassifyPanicMidRaceUnderQuantile(t *testing.T) {
	// Classify panics on the first copy's answer while its hedge runs
	// (HedgeQuantile, a delay known): the panic reaches the caller, the
	// copy's latency counts once, nothing is left running.
	synctest.Test(t, func(t *testing.T) {
		d := top(bucket(10 * time.Millisecond))
		var calls atomic.Int32
		var boom atomic.Bool
		tr := &Transport{Base: delays(&calls, append(rep(10*time.Millisecond, 20), d+time.Millisecond, time.Hour)...),
			Policy: Policy{HedgeQuantile: 0.5, HedgeRatio: 1, Classify: func(r *http.Response, err error) Class {
				if boom.Load() {
					panic("classify")
				}
				return DefaultClassify(r, err)
			}}}
		for range 20 {
			roundTrip(t, tr, newReq(t, "GET", ""))
		}
		synctest.Wait()
		before := samples(tr)
		boom.Store(true)
		func() {
			defer func() {
				if recover() == nil {
					t.Error("got no panic; want Classify's")
				}
			}()
			tr.RoundTrip(newReq(t, "GET", ""))
		}()
		time.Sleep(2 * time.Hour)
		if got := samples(tr) - before; got != 1 {
			t.Errorf("got %d samples; want 1", got)
		}
		if calls.Load() != 22 {
			t.Errorf("got %d calls; want 22 (the hedge went out)", calls.Load())
		}
	})
}

// The caller cancels while the first copy's base is slow to notice: no
// hedge is sent after it. A hedge for a request nobody waits for would take
// a permit from the Limiter, a share of the hedge quota and a fresh body.
func TestNoHedgeAfterTheCallerCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		var deadHedge atomic.Bool
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				time.Sleep(time.Second) // slow to notice the cancellation
				return nil, context.Canceled
			}
			if r.Context().Err() != nil {
				deadHedge.Store(true)
			}
			return nil, r.Context().Err()
		})
		lim := &RateLimiter{}
		holdAt(lim, 10, time.Hour)
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{HedgeDelay: 50 * time.Millisecond, HedgeRatio: 1}}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v; want canceled", err)
		}
		if n := calls.Load(); n != 1 || deadHedge.Load() {
			t.Errorf("got %d copies sent (a hedge with a dead context: %v); want 1: no hedge after the caller canceled", n, deadHedge.Load())
		}
		time.Sleep(time.Second) // the first copy lets go
	})
}

// The first copy of a hedged attempt is answered 429 with Retry-After: 2
// while its hedge runs; the hedge then fails with a 503. The throttle, not
// the last failure, is the attempt's outcome: the retry waits the 2 s the
// server asked for, not a transient backoff.
func TestHedgedRetryHonoursACopysRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(
			rht.RetryAfter(429, "2").WithDelay(20*time.Millisecond), // first copy, answered at 20ms
			rht.Status(503).WithDelay(20*time.Millisecond),          // hedge at 10ms, answered at 30ms
			rht.Status(200),
		)
		budget := newTokenBucket(500)
		var first Attempt
		tr := &Transport{Base: base, Budget: budget, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, MaxAttempts: 3, Rand: highRand},
			OnAttempt: func(a Attempt) {
				if a.Number == 1 {
					first = a
				}
			}}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200", code, err)
		}
		a := base.Attempts()
		if len(a) != 3 {
			t.Fatalf("got %d attempts; want 3", len(a))
		}
		if gap := a[2].Time.Sub(a[0].Time) - 20*time.Millisecond; gap < 2*time.Second {
			t.Errorf("the retry was sent %v after the 429 asked for Retry-After: 2; want at least 2s", gap)
		}
		if first.Class != Throttling || !first.ServerDelay {
			t.Errorf("got the first attempt weighed as %v, server delay %v; want Throttling, true", first.Class, first.ServerDelay)
		}

	})
}

// MaxHedges: math.MaxInt (no cap but the ratio) means 100: the copies'
// channel is not sized by it (it overflowed into a negative size).
func TestMaxHedgesHuge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(200))
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, MaxHedges: math.MaxInt}}
		var perr any
		func() {
			defer func() { perr = recover() }()
			roundTrip(t, tr, newReq(t, "GET", ""))
		}()
		if perr != nil {
			t.Errorf("RoundTrip panicked: %v; want a 200", perr)
		}
	})
}

// Many goroutines through hedging, a RateLimiter shared by PerHost
// destinations, a ledger budget and a Timeout: every response body the
// base handed out is closed, no payment is refunded twice, and each call
// returns a response or an error, never both.
func TestHedgingWithASharedLimiterPerHost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		led := newLedger(t)
		base := rht.NewTransport(
			rht.Status(200).WithDelay(30*time.Millisecond).WithBody("slow").Times(40),
			rht.RetryAfter(429, "1").WithBody("throttled").Times(20),
			rht.Status(503).WithBody("down").Times(40),
			rht.Status(200).WithBody("ok").Times(1000),
		)
		tr := &Transport{Base: base, Budget: led,
			PerHost: &PerHost{Limiter: func(string) *RateLimiter { return lim }, Budget: func(string) Budget { return led }},
			Policy:  Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, MaxHedges: 2, MaxAttempts: 4, Timeout: 3 * time.Second}}
		var wg sync.WaitGroup
		for i := range 60 {
			wg.Go(func() {
				time.Sleep(time.Duration(i%7) * time.Millisecond)
				url := []string{"http://a.test/", "http://b.test/", "http://c.test/"}[i%3]
				req, _ := http.NewRequest("GET", url, nil)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if i%5 == 0 {
					time.AfterFunc(15*time.Millisecond, cancel)
				}
				resp, err := tr.RoundTrip(req.WithContext(ctx))
				if (resp == nil) == (err == nil) {
					t.Errorf("got (%v, %v); want a response xor an error", resp, err)
				}
				if resp != nil {
					io.ReadAll(resp.Body)
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		time.Sleep(time.Second) // late losers drain
		synctest.Wait()
		if n := base.OpenBodies(); n != 0 {
			t.Errorf("got %d response bodies left open; want 0", n)
		}
		led.check(t) // no payment refunded twice, none refunded unpaid
	})
}

// scriptStep is one copy's scripted answer: after delay (or when its context
// ends first, with the context's error), a status with a body naming the
// copy, or err.
type scriptStep struct {
	delay time.Duration
	code  int
	ra    string
	err   error
	hang  bool // until the copy's context ends
	deaf  bool // the delay ignores the copy's context
	panic any  // the base panics with it after the delay
}

// scriptBase answers the copies in the order they are sent, and counts each
// body's Close calls.
type scriptBase struct {
	steps []scriptStep
	mu    sync.Mutex
	n     int
	sent  []time.Time
	bods  []*atomic.Int32
	ctxs  []context.Context
}

type countedBody struct {
	io.Reader
	n *atomic.Int32
}

func (b *countedBody) Close() error { b.n.Add(1); return nil }

func (b *scriptBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.ReadAll(r.Body)
		r.Body.Close()
	}
	b.mu.Lock()
	i := b.n
	b.n++
	b.sent = append(b.sent, time.Now())
	b.ctxs = append(b.ctxs, r.Context())
	b.mu.Unlock()
	st := scriptStep{code: 200}
	if i < len(b.steps) {
		st = b.steps[i]
	}
	ctx := r.Context()
	if st.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if st.deaf {
		time.Sleep(st.delay)
	} else if st.delay > 0 {
		timer := time.NewTimer(st.delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
	}
	if st.panic != nil {
		panic(st.panic)
	}
	if st.err != nil {
		return nil, st.err
	}
	n := new(atomic.Int32)
	b.mu.Lock()
	b.bods = append(b.bods, n)
	b.mu.Unlock()
	h := http.Header{}
	if st.ra != "" {
		h.Set("Retry-After", st.ra)
	}
	return &http.Response{StatusCode: st.code, Header: h, Body: &countedBody{strings.NewReader(fmt.Sprintf("copy%d", i)), n}, Request: r}, nil
}

// checkBodies reports every body not closed exactly once.
func (b *scriptBase) checkBodies(t *testing.T) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for i, n := range b.bods {
		if c := n.Load(); c != 1 {
			t.Errorf("response body %d closed %d times; want exactly 1", i, c)
		}
	}
}

var errScriptReset = &wrappedErr{syscall.ECONNRESET}

// Three copies (the first at 0, hedges at 10 and 20 ms) answered at 25, 30
// and 35 ms in every order of failures; MaxAttempts 3, so the race's
// outcome goes to the caller. The outcome is the last throttle, or without
// one the last failure; its body is readable and named for its copy; the
// Attempt is the outcome's; the Report holds every copy that answered;
// every body is closed once; the limiter saw each copy's answer once.
func TestHedgedOutcomeOrders(t *testing.T) {
	thr := func(d time.Duration, ra string) scriptStep { return scriptStep{delay: d, code: 429, ra: ra} }
	unav := func(d time.Duration) scriptStep { return scriptStep{delay: d, code: 503} }
	reset := func(d time.Duration) scriptStep { return scriptStep{delay: d, err: errScriptReset} }
	ok := func(d time.Duration) scriptStep { return scriptStep{delay: d, code: 200} }
	tests := []struct {
		name  string
		steps []scriptStep
		code  int    // 0 for an error
		body  string // the outcome's copy
		class Class
	}{
		{"429, reset, 503", []scriptStep{thr(25*time.Millisecond, "1"), reset(20 * time.Millisecond), unav(15 * time.Millisecond)}, 429, "copy0", Throttling},
		{"503, 429, reset", []scriptStep{unav(25 * time.Millisecond), thr(20*time.Millisecond, "1"), reset(15 * time.Millisecond)}, 429, "copy1", Throttling},
		{"reset, 503, 503", []scriptStep{reset(25 * time.Millisecond), unav(20 * time.Millisecond), unav(15 * time.Millisecond)}, 503, "copy2", Transient},
		{"429, 429, 503", []scriptStep{thr(25*time.Millisecond, "1"), thr(20*time.Millisecond, "2"), unav(15 * time.Millisecond)}, 429, "copy1", Throttling},
		{"503, reset, 429", []scriptStep{unav(25 * time.Millisecond), reset(20 * time.Millisecond), thr(15*time.Millisecond, "1")}, 429, "copy2", Throttling},
		{"503, 503, reset", []scriptStep{unav(25 * time.Millisecond), unav(20 * time.Millisecond), reset(15 * time.Millisecond)}, 0, "", Transient},
		{"reset, reset, reset", []scriptStep{reset(25 * time.Millisecond), reset(20 * time.Millisecond), reset(15 * time.Millisecond)}, 0, "", Transient},
		{"429, 200, hang", []scriptStep{thr(25*time.Millisecond, "1"), ok(20 * time.Millisecond), {hang: true}}, 200, "copy1", Success},
		{"429, reset, 200", []scriptStep{thr(25*time.Millisecond, "1"), reset(20 * time.Millisecond), ok(15 * time.Millisecond)}, 200, "copy2", Success},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{steps: tc.steps}
				inner := &Transport{Base: base, Policy: Policy{MaxAttempts: 1}}
				var rep Report
				var atts []Attempt
				tr := &Transport{Base: inner, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxHedges: 2, MaxAttempts: 3, SendAttemptHeader: true},
					OnAttempt: func(a Attempt) { atts = append(atts, a) }}
				ctx := newOnceWatchCtx()
				req, _ := http.NewRequestWithContext(WithReport(ctx, &rep), "GET", "http://example.test/", nil)
				resp, err := tr.RoundTrip(req)
				if (resp == nil) == (err == nil) {
					t.Fatalf("got (%v, %v); want a response xor an error", resp, err)
				}
				if tc.code == 0 {
					if err == nil || !errors.Is(err, syscall.ECONNRESET) {
						t.Errorf("got %v; want the reset", err)
					}
				} else {
					if err != nil {
						t.Fatalf("got %v; want a %d", err, tc.code)
					}
					b, rerr := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != tc.code || string(b) != tc.body || rerr != nil {
						t.Errorf("got %d %q (%v); want %d %q", resp.StatusCode, b, rerr, tc.code, tc.body)
					}
				}
				if len(atts) != 1 || atts[0].Class != tc.class || (atts[0].Err == nil) != (tc.code != 0) {
					t.Errorf("got attempts %+v; want one, of class %v", atts, tc.class)
				}
				// The Report holds the inner attempt of each copy that
				// answered before the outcome was known (its Attempt
				// header names it), in the order they answered (the copies'
				// own), then the outer attempt: every copy when all failed,
				// the copies up to the winner when one won.
				answered := 3
				if tc.class == Success {
					answered = mustAtoi(strings.TrimPrefix(tc.body, "copy")) + 1
				}
				var inners, want []string
				for _, a := range rep.History[:len(rep.History)-1] {
					inners = append(inners, a.Request.Header.Get(attemptHeader))
				}
				for i := range answered {
					want = append(want, fmt.Sprint(i+1))
				}
				if last := rep.History[len(rep.History)-1]; fmt.Sprint(inners) != fmt.Sprint(want) || last.Request != atts[0].Request {
					t.Errorf("got inner attempts of copies %v in the Report, then %v; want %v, then the outer attempt", inners, last, want)
				}
				time.Sleep(time.Second)
				synctest.Wait()
				base.checkBodies(t)
				if n := ctx.held(); n != 0 {
					t.Errorf("got %d derived contexts still running; want 0", n)
				}
			})
		})
	}
}

func mustAtoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// Classify panics at its k-th call, with failures kept by the race, and
// OnAttempt panics after a race whose outcome was a kept failure: the panic
// reaches the caller, every body is closed once, every context released,
// and nothing runs on.
func TestHedgedPanicsWithKeptFailures(t *testing.T) {
	thr := func(d time.Duration) scriptStep { return scriptStep{delay: d, code: 429, ra: "1"} }
	unav := func(d time.Duration) scriptStep { return scriptStep{delay: d, code: 503} }
	reset := func(d time.Duration) scriptStep { return scriptStep{delay: d, err: errScriptReset} }
	orders := map[string][]scriptStep{
		"429, reset, 503": {thr(25 * time.Millisecond), reset(20 * time.Millisecond), unav(15 * time.Millisecond)},
		"503, 429, 503":   {unav(25 * time.Millisecond), thr(20 * time.Millisecond), unav(15 * time.Millisecond)},
		"503, 503, 429":   {unav(25 * time.Millisecond), unav(20 * time.Millisecond), thr(15 * time.Millisecond)},
		"429, 429, hang":  {thr(25 * time.Millisecond), thr(20 * time.Millisecond), {hang: true}},
		"same time":       {unav(20 * time.Millisecond), thr(10 * time.Millisecond), unav(0)},
	}
	for name, steps := range orders {
		for k := 1; k <= 4; k++ { // k 4: OnAttempt
			t.Run(fmt.Sprintf("%s/panic %d", name, k), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := &scriptBase{steps: steps}
					var calls int
					p := Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxHedges: 2, MaxAttempts: 3, Timeout: time.Minute,
						Classify: func(resp *http.Response, err error) Class {
							calls++
							if calls == k {
								panic("classify")
							}
							return DefaultClassify(resp, err)
						}}
					var hook func(Attempt)
					if k == 4 {
						hook = func(Attempt) { panic("hook") }
					}
					lim := &RateLimiter{}
					holdAt(lim, 1000, time.Hour)
					tr := &Transport{Base: base, Policy: p, OnAttempt: hook, Limiter: lim, Budget: newLedger(t)}
					ctx := newOnceWatchCtx()
					req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
					func() {
						defer func() { recover() }() // the hook's panic, when its call comes
						if resp, err := tr.RoundTrip(req); err == nil {
							resp.Body.Close()
						}
					}()
					time.Sleep(time.Hour)
					synctest.Wait()
					base.checkBodies(t)
					if n := ctx.held(); n != 0 {
						t.Errorf("got %d derived contexts still running; want 0", n)
					}
				})
			})
		}
	}
}

// onceWatchCtx counts the contexts derived from it that are still running;
// a stop called twice (a timerCtx's timer, then its cancel) counts once.
type onceWatchCtx struct {
	context.Context
	done    chan struct{}
	running atomic.Int32
}

func newOnceWatchCtx() *onceWatchCtx {
	return &onceWatchCtx{Context: context.Background(), done: make(chan struct{})}
}

func (c *onceWatchCtx) Done() <-chan struct{} { return c.done }

func (c *onceWatchCtx) AfterFunc(func()) func() bool {
	c.running.Add(1)
	var once sync.Once
	return func() bool { once.Do(func() { c.running.Add(-1) }); return true }
}

func (c *onceWatchCtx) held() int { return int(c.running.Load()) }

// The limiter sees each copy's answer once: a kept failure, a discarded
// one, the winner and a late 429 that comes after the race is over. Copies
// sent under permits of one round cut once (holdAt's cut is the first).
func TestHedgedLimiterSeesEachAnswerOnce(t *testing.T) {
	type counts struct{ cuts uint64 }
	tests := []struct {
		name  string
		steps []scriptStep
		want  counts
	}{
		// 429 (a cut), then a reset (an error), then a 503.
		{"429, reset, 503", []scriptStep{{delay: 25 * time.Millisecond, code: 429}, {delay: 20 * time.Millisecond, err: errScriptReset}, {delay: 15 * time.Millisecond, code: 503}}, counts{2}},
		// 429 cuts; the second 429 is of the round before; the 503 an
		// answer.
		{"429, 429, 503", []scriptStep{{delay: 25 * time.Millisecond, code: 429}, {delay: 20 * time.Millisecond, code: 429}, {delay: 15 * time.Millisecond, code: 503}}, counts{2}},
		// 503, 429 cuts, 200 wins.
		{"503, 429, 200", []scriptStep{{delay: 25 * time.Millisecond, code: 503}, {delay: 20 * time.Millisecond, code: 429}, {delay: 15 * time.Millisecond, code: 200}}, counts{2}},
		// 200 wins at 25; the deaf copies answer 429 late, at 30 and 35:
		// the first cuts, the second is of the round before.
		{"200, late 429, late 429", []scriptStep{{delay: 25 * time.Millisecond, code: 200}, {delay: 20 * time.Millisecond, code: 429, deaf: true}, {delay: 15 * time.Millisecond, code: 429, deaf: true}}, counts{2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{steps: tc.steps}
				lim := &RateLimiter{}
				holdAt(lim, 1000, time.Hour)
				tr := &Transport{Base: base, Limiter: lim, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxHedges: 2, MaxAttempts: 3}}
				resp, err := tr.RoundTrip(newReq(t, "GET", ""))
				if err == nil {
					io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if base.n != 3 {
					t.Fatalf("got %d copies; want 3", base.n)
				}
				got := counts{lim.Stats().Cuts}
				if got != tc.want {
					t.Errorf("got limiter %+v; want %+v", got, tc.want)
				}
				base.checkBodies(t)
			})
		})
	}
}

// A kept 429's Retry-After is honoured by the retry, and capped by
// MaxServerDelay (StopServerDelay: the 429 goes back, readable).
func TestHedgedKeptRetryAfter(t *testing.T) {
	steps := func() []scriptStep {
		return []scriptStep{{delay: 25 * time.Millisecond, code: 503}, {delay: 20 * time.Millisecond, code: 429, ra: "3"}, {delay: 15 * time.Millisecond, err: errScriptReset}, {code: 200}}
	}
	t.Run("honoured", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &scriptBase{steps: steps()}
			var atts []Attempt
			tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxHedges: 2, MaxAttempts: 4, Rand: lowRand},
				OnAttempt: func(a Attempt) { atts = append(atts, a) }}
			start := time.Now()
			code, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
			if err != nil || code != 200 || body != "copy3" {
				t.Fatalf("got (%d %q, %v); want copy3's 200", code, body, err)
			}
			if gap := base.sent[3].Sub(start) - 30*time.Millisecond; gap < 3*time.Second {
				t.Errorf("retry sent %v after the 429 asked for 3s", gap)
			}
			if atts[0].Class != Throttling || !atts[0].ServerDelay || atts[0].Err != nil {
				t.Errorf("got first attempt %+v; want the 429's", atts[0])
			}
			time.Sleep(time.Second)
			synctest.Wait()
			base.checkBodies(t)
		})
	})
	t.Run("beyond MaxServerDelay", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &scriptBase{steps: steps()}
			var rep Report
			tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxHedges: 2, MaxAttempts: 4, MaxServerDelay: time.Second}}
			req := newReq(t, "GET", "")
			code, body, err := roundTrip(t, tr, req.WithContext(WithReport(req.Context(), &rep)))
			if err != nil || code != 429 || body != "copy1" || rep.Decision != StopServerDelay {
				t.Errorf("got (%d %q, %v, %v); want copy1's 429, StopServerDelay", code, body, err, rep.Decision)
			}
			time.Sleep(time.Second)
			synctest.Wait()
			base.checkBodies(t)
		})
	})
}

// The caller cancels, or its deadline passes, while a 429 is kept and
// another copy runs: a response xor an error, every body closed once, no
// hedge after the end, no context left running.
func TestHedgedCallerEndsMidRace(t *testing.T) {
	for _, deadline := range []bool{false, true} {
		t.Run(fmt.Sprint("deadline ", deadline), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{steps: []scriptStep{{delay: 25 * time.Millisecond, code: 429, ra: "1"}, {hang: true}, {hang: true}}}
				tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxHedges: 2, MaxAttempts: 5}}
				wctx := newOnceWatchCtx()
				var ctx context.Context
				var cancel context.CancelFunc
				if deadline {
					ctx, cancel = context.WithTimeout(wctx, 27*time.Millisecond)
				} else {
					ctx, cancel = context.WithCancel(wctx)
					time.AfterFunc(27*time.Millisecond, cancel)
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
				resp, err := tr.RoundTrip(req)
				t.Logf("got resp %v, err %v", resp != nil, err)
				if (resp == nil) == (err == nil) {
					t.Fatalf("got (%v, %v); want a response xor an error", resp, err)
				}
				if resp != nil {
					b, rerr := io.ReadAll(resp.Body)
					t.Logf("body %q %v", b, rerr)
					resp.Body.Close()
				}
				cancel()
				time.Sleep(time.Second)
				synctest.Wait()
				if base.n != 3 {
					t.Errorf("got %d copies; want 3 (hedges at 10 and 20 ms, none after)", base.n)
				}
				base.checkBodies(t)
				if n := wctx.held(); n != 0 {
					t.Errorf("got %d derived contexts still running; want 0", n)
				}
			})
		})
	}
}

// Random races of up to four copies (hedges at 10, 20, 30 ms) against a
// model of the rule: the first answer that is not a retryable failure wins;
// when every copy sent fails, the last throttle, or without one the last
// failure, is the outcome. Every body is closed once; no context is left.
func TestHedgedRandomRaces(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	kinds := []scriptStep{{code: 200}, {code: 429, ra: "1"}, {code: 503}, {err: errScriptReset}, {code: 404}}
	for c := range 300 {
		var steps []scriptStep
		used := map[int]bool{}
		var at []int
		for i := range 4 {
			var d int
			for {
				d = 1 + 2*rng.IntN(30)
				if !used[10*i+d] {
					break
				}
			}
			used[10*i+d] = true
			st := kinds[rng.IntN(len(kinds))]
			st.delay = time.Duration(d) * time.Millisecond
			steps = append(steps, st)
			at = append(at, 10*i+d)
		}
		// The model.
		winner, kept, inflight, launched := -1, -1, 0, 0
		for now := 0; winner < 0 && now < 200; now++ {
			if now%10 == 0 && now/10 < 4 && now/10 == launched && (launched == 0 || inflight > 0) {
				launched++
				inflight++
			}
			for i := 0; i < launched; i++ {
				if at[i] != now {
					continue
				}
				inflight--
				st := steps[i]
				retryable := st.err != nil || st.code == 429 || st.code == 503
				if !retryable {
					winner = i
					break
				}
				if !(kept >= 0 && steps[kept].code == 429 && st.code != 429) {
					kept = i
				}
				if inflight == 0 {
					winner = kept
				}
			}
		}
		if w := steps[winner]; (w.err != nil || w.code == 429 || w.code == 503) && launched < 4 {
			continue // a retry follows: the race is not the request's last attempt
		}
		name := fmt.Sprint(c)
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{steps: steps}
				tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxHedges: 3, MaxAttempts: 4}}
				wctx := newOnceWatchCtx()
				req, _ := http.NewRequestWithContext(wctx, "GET", "http://example.test/", nil)
				resp, err := tr.RoundTrip(req)
				if (resp == nil) == (err == nil) {
					t.Fatalf("got (%v, %v); want a response xor an error", resp, err)
				}
				want := steps[winner]
				if want.err != nil {
					if err == nil {
						t.Errorf("steps %+v: got a %d; want copy %d's error", steps, resp.StatusCode, winner)
					}
				} else if err != nil {
					t.Errorf("steps %+v: got %v; want copy %d's %d", steps, err, winner, want.code)
				} else {
					b, _ := io.ReadAll(resp.Body)
					if resp.StatusCode != want.code || string(b) != fmt.Sprintf("copy%d", winner) {
						t.Errorf("steps %+v: got %d %q; want copy %d's %d", steps, resp.StatusCode, b, winner, want.code)
					}
				}
				if resp != nil {
					resp.Body.Close()
				}
				time.Sleep(time.Second)
				synctest.Wait()
				if base.n != launched {
					t.Errorf("got %d copies; want %d", base.n, launched)
				}
				base.checkBodies(t)
				if n := wctx.held(); n != 0 {
					t.Errorf("got %d derived contexts still running; want 0", n)
				}
			})
		})
	}
}

// The same over loopback: hedged requests whose losing copies are canceled
// in flight made unrelated requests on the same pool fail as not retryable,
// 1 to 2% of them with every request hedged. None may end so now; a request
// still fails when stray cancellations strike every attempt MaxAttempts
// allows (about 1 in 1,000 on a loaded machine).
func TestHedgeCancelsDoNotFailOthers(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%3 == 0 {
			time.Sleep(time.Millisecond)
		}
		w.WriteHeader(204) // bodyless: the connection goes back to the pool before the response is delivered
	}))
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 4}
	defer base.CloseIdleConnections()
	tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 200 * time.Microsecond, HedgeRatio: 1, BaseDelay: time.Millisecond}}
	var notRetried, failed, made atomic.Int32
	var firstErr atomic.Value
	deadline := time.Now().Add(time.Second)
	done := make(chan struct{})
	const workers = 16
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for time.Now().Before(deadline) {
				req, _ := http.NewRequest("GET", srv.URL, nil)
				made.Add(1)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err)
					if e := (*Error)(nil); errors.As(err, &e) && e.Decision == Done {
						notRetried.Add(1) // taken for the caller's cancellation
					}
					continue
				}
				resp.Body.Close()
			}
		}()
	}
	for range workers {
		<-done
	}
	if n := notRetried.Load(); n > 0 {
		t.Errorf("got %d requests of %d ended as not retryable (first error: %v); want none: every request's context was alive", n, made.Load(), firstErr.Load())
	}
	if f, m := failed.Load(), made.Load(); f*100 > m {
		t.Errorf("got %d failed requests of %d (first: %v); want at most 1%%: only stray cancellations on every attempt allowed", f, m, firstErr.Load())
	}
}

// A copy that loses may still be running when RoundTrip has returned: its
// base noticed the cancellation late, and a middleware over it reads the
// request once the inner call ends. The caller, its response body closed,
// may change its request then (the RoundTripper contract); each copy sends
// a deep copy of its own, so the change never reaches a copy in flight.
func TestHedgedCopiesOwnTheirRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int32
		inner := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 { // the first copy: slow, and late to notice it was canceled
				<-r.Context().Done()
				time.Sleep(20 * time.Millisecond)
				return nil, r.Context().Err()
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
		})
		seen := make(chan string, 2)
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := inner.RoundTrip(r)
			seen <- r.Header.Get("X-Call") // a logging middleware's line
			return resp, err
		})
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 5 * time.Millisecond, HedgeRatio: 1}}
		req := newReq(t, "GET", "")
		req.Header.Set("X-Call", "first")
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		req.Header.Set("X-Call", "second") // allowed: the body is closed
		for range 2 {
			if got := <-seen; got != "first" {
				t.Errorf("a copy saw X-Call %q; want %q, as sent", got, "first")
			}
		}
	})
}

// The same over loopback with net/http under the middleware, the caller
// reusing its request after each body is closed, as polling loops do: the
// race detector reported a data race on the header in every run before
// copies had requests of their own.
func TestHedgedCopiesOwnTheirRequestsOverLoopback(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1)%2 == 1 { // the first copy of each call is slow
			select {
			case <-r.Context().Done():
			case <-time.After(200 * time.Millisecond):
			}
			return
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	inner := &http.Transport{}
	defer inner.CloseIdleConnections()
	var logged atomic.Value
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		resp, err := inner.RoundTrip(r)
		logged.Store(r.Header.Get("X-Call"))
		return resp, err
	})
	tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 2 * time.Millisecond, HedgeRatio: 10}}
	req := mustReq(t, "GET", srv.URL)
	for i := range 50 {
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		req.Header.Set("X-Call", strconv.Itoa(i))
	}
}

// A key on an idempotent request does not stop hedging: the 409 a
// deduplicating server gives a copy of a write in progress concerns writes
// (the IETF draft's key is for non-idempotent methods). The AWS SDK sends
// its invocation id, AWSPolicy's idempotency header, on every request, an
// S3 GetObject included.
func TestKeyedReadsAreHedged(t *testing.T) {
	tests := []struct {
		name, header, value string
		policy              Policy
	}{
		{"AWSPolicy's invocation id on an S3 GET", "Amz-Sdk-Invocation-Id", "7d2c8b5e-6a1f-4a0e-9d7b-2f6a1c3e9b10",
			Policy{IdempotencyHeader: "Amz-Sdk-Invocation-Id", HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}},
		{"a GET with an Idempotency-Key (Stripe: no effect on GET)", "Idempotency-Key", "k-1",
			Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int32
				base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					if calls.Add(1) == 1 { // the first copy is slow
						select {
						case <-r.Context().Done():
							return nil, r.Context().Err()
						case <-time.After(time.Second):
						}
					}
					return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
				})
				tr := &Transport{Base: base, Policy: tt.policy}
				req := mustReq(t, "GET", "https://bucket.s3.us-east-1.amazonaws.com/object")
				req.Header.Set(tt.header, tt.value)
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if took := time.Since(start); took != 10*time.Millisecond || calls.Load() != 2 {
					t.Errorf("took %v with %d copies; want the hedge's answer after 10ms, 2 copies", took, calls.Load())
				}
			})
		})
	}
}

// basePanic is the value a scripted base panics with.
type basePanic struct{ copy int }

// A Base that panics, with hedging on: the panic reaches the caller's
// recover with its value, as it does without hedging, whichever copy
// panics, and once the race is over every body is closed once, every
// context released, and every retry's Tokens settled once. A copy that
// panics after RoundTrip returned has no caller to reach: the process goes
// on.
func TestHedgedBasePanicReachesTheCaller(t *testing.T) {
	unav := func(d time.Duration) scriptStep { return scriptStep{delay: d, code: 503} }
	boom := func(d time.Duration, i int) scriptStep { return scriptStep{delay: d, panic: basePanic{i}} }
	tests := []struct {
		name   string
		policy Policy
		steps  []scriptStep
		want   any // nil: a 200 and no panic
		spent  int // retries paid, sent and not known to succeed
	}{
		{"no hedge sent", Policy{HedgeDelay: time.Hour}, []scriptStep{boom(0, 0)}, basePanic{0}, 0},
		{"the hedge, while the first copy runs", Policy{HedgeDelay: 10 * time.Millisecond},
			[]scriptStep{{hang: true}, boom(5*time.Millisecond, 1)}, basePanic{1}, 0},
		{"the first copy, while the hedge runs", Policy{HedgeDelay: 10 * time.Millisecond},
			[]scriptStep{boom(20*time.Millisecond, 0), {hang: true}}, basePanic{0}, 0},
		{"after a failure kept", Policy{HedgeDelay: 10 * time.Millisecond},
			[]scriptStep{unav(15 * time.Millisecond), boom(10*time.Millisecond, 1)}, basePanic{1}, 0},
		{"a retry's copy", Policy{HedgeDelay: 10 * time.Millisecond, Rand: lowRand},
			[]scriptStep{unav(0), {hang: true}, boom(5*time.Millisecond, 2)}, basePanic{2}, 1},
		{"a loser, after the hedge won", Policy{HedgeDelay: 10 * time.Millisecond},
			[]scriptStep{{delay: time.Second, deaf: true, panic: basePanic{0}}, {code: 200}}, nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{steps: tc.steps}
				budget := newLedger(t)
				p := tc.policy
				p.HedgeRatio, p.Timeout = 10, time.Minute
				tr := &Transport{Base: base, Policy: p, Budget: budget}
				ctx := newOnceWatchCtx()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
				var got any
				func() {
					defer func() { got = recover() }()
					resp, err := tr.RoundTrip(req)
					if err != nil || resp.StatusCode != 200 {
						t.Errorf("got (%v, %v); want a 200 or a panic", resp, err)
					}
					if err == nil {
						resp.Body.Close()
					}
				}()
				if got != tc.want {
					t.Errorf("got %v recovered; want %v", got, tc.want)
				}
				time.Sleep(time.Hour)
				synctest.Wait()
				base.checkBodies(t)
				if n := ctx.held(); n != 0 {
					t.Errorf("got %d derived contexts still running; want 0", n)
				}
				budget.check(t)
				if n := budget.unsettled(); n != tc.spent {
					t.Errorf("got %d Tokens spent; want %d", n, tc.spent)
				}
			})
		})
	}
}

// lateBody's first read waits for delay, or fails when ctx ends first.
type lateBody struct {
	ctx   context.Context
	delay time.Duration
	read  bool
}

func (b *lateBody) Read(p []byte) (int, error) {
	if b.read {
		return 0, io.EOF
	}
	select {
	case <-time.After(b.delay):
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
	b.read = true
	return copy(p, "ok"), nil
}

func (b *lateBody) Close() error { return nil }

// AttemptTimeout bounds each copy of a hedged attempt as it bounds an
// attempt that is not hedged: each copy is an attempt, ended after
// AttemptTimeout with ErrAttemptTimeout, whether the share pays for a
// hedge or not. It never cuts off the body of the copy that won.
func TestAttemptTimeoutBoundsHedgedAttempts(t *testing.T) {
	hangs := []rht.Step{rht.Hang()}
	tests := []struct {
		name     string
		policy   Policy
		steps    []rht.Step
		want     error // nil: a 200 whose body reads "ok"
		attempts int
		took     time.Duration
		hedges   int
	}{
		{"not hedged", Policy{}, hangs, ErrAttemptTimeout, 3, 3 * time.Second, 0},
		{"the share refuses every hedge", Policy{HedgeDelay: 100 * time.Millisecond}, hangs, ErrAttemptTimeout, 3, 3 * time.Second, 0},
		{"HedgeDelay past AttemptTimeout", Policy{HedgeDelay: 2 * time.Second, HedgeRatio: 10}, hangs, ErrAttemptTimeout, 3, 3 * time.Second, 0},
		// A hedge sent as its first copy runs out would be a retry that
		// neither waits nor pays.
		{"HedgeDelay equal to AttemptTimeout", Policy{HedgeDelay: time.Second, HedgeRatio: 10}, hangs, ErrAttemptTimeout, 3, 3 * time.Second, 0},
		// The first copy ends at 1s, its hedge at 1.1s; the last attempt,
		// alone, at 2.1s.
		{"the hedge sent", Policy{HedgeDelay: 100 * time.Millisecond, HedgeRatio: 10}, hangs, ErrAttemptTimeout, 3, 2100 * time.Millisecond, 1},
		{"MaxHedges 3", Policy{HedgeDelay: 100 * time.Millisecond, HedgeRatio: 10, MaxHedges: 3, MaxAttempts: 4}, hangs, ErrAttemptTimeout, 4, 1300 * time.Millisecond, 3},
		// The first copy times out at 1s while its hedge runs: the hedge's
		// 200 at 1.5s wins.
		{"a hedge wins after the first copy timed out", Policy{HedgeDelay: 600 * time.Millisecond, HedgeRatio: 10},
			[]rht.Step{rht.Hang().Times(1), rht.Status(200).WithBody("ok").WithDelay(900 * time.Millisecond)}, nil, 0, 1500 * time.Millisecond, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := tc.policy
				p.AttemptTimeout, p.Rand = time.Second, lowRand
				var hedges int
				tr := &Transport{Base: rht.NewTransport(tc.steps...), Policy: p, OnAttempt: func(a Attempt) { hedges += a.Hedges }}
				// No deadline: the test cancels the request only if it has
				// not returned within an hour.
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://a.test/", nil)
				start := time.Now()
				var resp *http.Response
				var err error
				done := make(chan struct{})
				go func() {
					defer close(done)
					resp, err = tr.RoundTrip(req)
				}()
				select {
				case <-done:
				case <-time.After(time.Hour):
					cancel()
					<-done
					t.Fatalf("got no return within an hour (%v); want %v after %v", err, tc.want, tc.took)
				}
				took := time.Since(start)
				if tc.want == nil {
					if err != nil {
						t.Fatalf("got %v after %v; want a 200 after %v", err, took, tc.took)
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if string(b) != "ok" || took != tc.took || hedges != tc.hedges {
						t.Errorf("got %q after %v, %d hedges; want \"ok\" after %v, %d", b, took, hedges, tc.took, tc.hedges)
					}
					return
				}
				var e *Error
				if !errors.As(err, &e) || !errors.Is(err, tc.want) || e.Attempts != tc.attempts || took != tc.took || hedges != tc.hedges {
					t.Errorf("got %v after %v, %d hedges; want %v after %d attempts, %v, %d hedges", err, took, hedges, tc.want, tc.attempts, tc.took, tc.hedges)
				}
			})
		})
	}
	t.Run("the winner's body outlives AttemptTimeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 200, Header: http.Header{}, Request: r,
					Body: &lateBody{ctx: r.Context(), delay: 3 * time.Second}}, nil
			})
			tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: time.Second, HedgeDelay: 100 * time.Millisecond, HedgeRatio: 10}}
			code, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
			if err != nil || code != 200 || body != "ok" {
				t.Errorf("got (%d, %q, %v); want (200, \"ok\", nil)", code, body, err)
			}
		})
	})
}

// An outer hedging Transport over an inner retrying one: the Report holds
// the inner attempts of every copy that answered before RoundTrip
// returned, as the inner OnAttempt saw them, in the order the copies
// answered, then the outer attempt. A copy still running when RoundTrip
// returns keeps its attempts to a Report of its own.
func TestReportHoldsEveryCopysAttempts(t *testing.T) {
	tests := []struct {
		name  string
		steps []scriptStep // the inner attempts, in the order they are sent
		inner int          // inner attempts made, the losers' included
		want  []string     // the Report: Number:Status of each attempt
	}{
		// Copy 1 (at 0): 503 at 20ms, retried, 503 at 40ms; copy 2 (at
		// 10ms): 503 at 30ms, retried, 503 at 50ms.
		{"every copy fails", []scriptStep{{delay: 20 * time.Millisecond, code: 503}, {delay: 20 * time.Millisecond, code: 503},
			{delay: 20 * time.Millisecond, code: 503}, {delay: 20 * time.Millisecond, code: 503}},
			4, []string{"1:503", "2:503", "1:503", "2:503", "1:503"}},
		// Copy 1 fails at 8 and 16ms, and its answer is kept while copy
		// 2 (at 10ms) runs; copy 2 then wins with a 200 at 30ms.
		{"a copy fails, the other wins", []scriptStep{{delay: 8 * time.Millisecond, code: 503}, {delay: 8 * time.Millisecond, code: 503},
			{delay: 20 * time.Millisecond, code: 200}},
			3, []string{"1:503", "2:503", "1:200", "1:200"}},
		// Copy 2 (at 10ms) wins at 15ms; copy 1 is still running, and
		// its late answer stays out of the Report.
		{"a loser still running", []scriptStep{{hang: true}, {delay: 5 * time.Millisecond, code: 200}},
			2, []string{"1:200", "1:200"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &scriptBase{steps: tc.steps}
				var innerSeen atomic.Int32
				inner := &Transport{Base: base, Policy: Policy{MaxAttempts: 2, Rand: lowRand},
					OnAttempt: func(Attempt) { innerSeen.Add(1) }}
				outer := &Transport{Base: inner, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 10, MaxAttempts: 2}}
				var rep Report
				req := newReq(t, "GET", "")
				req = req.WithContext(WithReport(req.Context(), &rep))
				roundTrip(t, outer, req)
				var got []string
				for _, a := range rep.History {
					got = append(got, fmt.Sprintf("%d:%d", a.Number, a.Status))
				}
				if fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Errorf("got a Report of %v; want %v", got, tc.want)
				}
				time.Sleep(time.Hour)
				synctest.Wait()
				if n, seen := len(rep.History), int(innerSeen.Load()); n != len(tc.want) || seen != tc.inner {
					t.Errorf("got %d attempts in the Report and %d inner ones seen once the losers ended; want %d and %d", n, seen, len(tc.want), tc.inner)
				}
			})
		})
	}
}

// A Base that ends its goroutine (runtime.Goexit, as t.FailNow does) on a
// hedged copy fails that copy with an error: the race neither hangs
// waiting for its answer nor panics the caller.
func TestHedgedBaseGoexitFailsTheCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &Transport{Base: roundTripperFunc(func(*http.Request) (*http.Response, error) {
			runtime.Goexit()
			return nil, nil
		}), Policy: Policy{HedgeDelay: time.Hour}}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://a.test/", nil)
		var err error
		var panicked any
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer func() { panicked = recover() }()
			_, err = tr.RoundTrip(req)
		}()
		select {
		case <-done:
		case <-time.After(2 * time.Hour):
			cancel()
			<-done
			t.Fatal("got no return within two hours; want an error at once")
		}
		var e *Error
		if panicked != nil || !errors.As(err, &e) || e.Attempts != 1 {
			t.Errorf("got %v, a panic of %v; want an *Error after 1 attempt", err, panicked)
		}
	})
}

// chaosBase answers each attempt at random: it hangs, panics, ignores its
// context, resets, ends its goroutine, or answers 200, 503, 429 or 404,
// after up to 80ms. It counts the closes of every body it hands out.
type chaosBase struct {
	mu   sync.Mutex
	rng  *rand.Rand
	bods []*atomic.Int32
}

func (b *chaosBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	k, d := b.rng.IntN(10), time.Duration(b.rng.IntN(80))*time.Millisecond
	b.mu.Unlock()
	ctx := r.Context()
	wait := func() error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	switch k {
	case 0:
		<-ctx.Done()
		return nil, ctx.Err()
	case 1:
		if err := wait(); err != nil {
			return nil, err
		}
		panic(basePanic{k})
	case 2:
		time.Sleep(d) // deaf to its context
	case 3:
		if err := wait(); err != nil {
			return nil, err
		}
		return nil, errScriptReset
	case 4:
		if d < 10*time.Millisecond {
			runtime.Goexit()
		}
		fallthrough
	default:
		if err := wait(); err != nil {
			return nil, err
		}
	}
	n := new(atomic.Int32)
	b.mu.Lock()
	b.bods = append(b.bods, n)
	b.mu.Unlock()
	code := []int{200, 200, 503, 429, 404}[int(d/time.Millisecond)%5]
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: &countedBody{strings.NewReader("x"), n}, Request: r}, nil
}

// Hedging, AttemptTimeout, Timeout, per-destination budgets and limiters
// and a Report, under 10 concurrent callers of a chaosBase: every
// RoundTrip returns a response xor an error, or panics with the base's
// value; every body is closed once, every context released, no Tokens
// refunded twice or unpaid, and every Report holds an attempt unless the
// Limiter had no permit for the first.
func TestHedgedChaosKeepsTheContract(t *testing.T) {
	for seed := range 10 {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &chaosBase{rng: rand.New(rand.NewPCG(uint64(seed), 7))}
				led := newLedger(t)
				tr := &Transport{Base: base,
					PerHost: &PerHost{Budget: func(string) Budget { return led }, Limiter: func(string) *RateLimiter { return &RateLimiter{} }},
					Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 0.5, MaxHedges: 1 + seed%3, MaxAttempts: 2 + seed%3,
						AttemptTimeout: 50 * time.Millisecond, Timeout: 300 * time.Millisecond, BaseDelay: time.Millisecond}}
				wctx := newOnceWatchCtx()
				var wg sync.WaitGroup
				for w := range 10 {
					wg.Go(func() {
						for i := range 20 {
							var rep Report
							url := fmt.Sprintf("http://h%d.test/", (w+i)%3)
							req, _ := http.NewRequestWithContext(WithReport(wctx, &rep), "GET", url, nil)
							func() {
								defer func() {
									if v := recover(); v != nil && v != (basePanic{1}) {
										t.Errorf("got a panic of %v; want none, or the base's", v)
									}
								}()
								resp, err := tr.RoundTrip(req)
								if (resp == nil) == (err == nil) {
									t.Errorf("got (%v, %v); want a response xor an error", resp, err)
								}
								if err == nil {
									io.ReadAll(resp.Body)
									resp.Body.Close()
								}
								if len(rep.History) == 0 && !errors.Is(err, ErrRateLimited) {
									t.Errorf("got an empty Report (%v); want an attempt at least, or no send permit", err)
								}
							}()
						}
					})
				}
				wg.Wait()
				time.Sleep(time.Hour)
				synctest.Wait()
				for i, n := range base.bods {
					if c := n.Load(); c != 1 {
						t.Errorf("got body %d closed %d times; want 1", i, c)
					}
				}
				if n := wctx.held(); n != 0 {
					t.Errorf("got %d derived contexts still running; want 0", n)
				}
				led.check(t)
			})
		})
	}
}
