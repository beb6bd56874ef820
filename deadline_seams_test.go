package retryhttp

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func TestAttemptTimeoutQuantileHungStaysAtCeiling(t *testing.T) {
	// A dependency that answers in 100ms, 1s or 100s, then hangs for
	// everyone: the measured timeout climbs to AttemptTimeout and stays
	// there, however long AttemptTimeout is, window after window.
	tests := []struct {
		name    string
		latency time.Duration
		ceiling time.Duration
	}{
		{"100ms, ceiling 10s", 100 * time.Millisecond, 10 * time.Second},
		{"1s, ceiling 5m", time.Second, 5 * time.Minute},
		{"100s, ceiling 5m", 100 * time.Second, 5 * time.Minute},
		{"100s, ceiling 1h", 100 * time.Second, time.Hour},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &latencyBase{latency: func(int64) time.Duration { return tc.latency }}
				tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: tc.ceiling, AttemptTimeoutQuantile: 0.999}}
				for range 1000 {
					attempt(t, tr)
				}
				base.latency = func(int64) time.Duration { return math.MaxInt64 } // hangs past any timeout
				var prev time.Duration
				atCeiling := -1
				for i := range 1500 {
					got, cut := attempt(t, tr)
					if !cut || got > tc.ceiling || got < time.Millisecond {
						t.Fatalf("hung attempt %d: cut %v after %v; want cut within [1ms, %v]", i+1, cut, got, tc.ceiling)
					}
					if got < prev {
						t.Fatalf("hung attempt %d: cut after %v, after %v before; want no fall while everything hangs", i+1, got, prev)
					}
					if got == tc.ceiling && atCeiling < 0 {
						atCeiling = i + 1
					}
					prev = got
				}
				if atCeiling < 0 {
					t.Errorf("got the last hung attempt cut after %v; want %v", prev, tc.ceiling)
				}
			})
		})
	}
}

func TestAttemptTimeoutQuantileOverrideCutsNotMeasured(t *testing.T) {
	// One caller's short Override.AttemptTimeout cuts its own attempts. Its
	// cuts say nothing of the dependency's latency: they must not pull the
	// measured timeout of every other request down to them.
	for _, hedged := range []bool{false, true} {
		name := "not hedged"
		if hedged {
			name = "hedged"
		}
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &latencyBase{latency: func(int64) time.Duration { return 100 * time.Millisecond }}
				p := Policy{AttemptTimeout: time.Second, AttemptTimeoutQuantile: 0.999}
				ov := Override{MaxAttempts: 1, AttemptTimeout: time.Millisecond}
				if hedged { // copies at 0 and 1ms, each cut 2ms after it began
					p.HedgeDelay = time.Millisecond
					ov = Override{MaxAttempts: 2, AttemptTimeout: 2 * time.Millisecond}
				}
				tr := &Transport{Base: base, Policy: p}
				for range 1000 {
					attempt(t, tr)
				}
				var a Attempt
				tr.OnAttempt = func(got Attempt) { a = got }
				for range 2000 {
					ctx := WithOverride(context.Background(), ov)
					if resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx)); err == nil {
						resp.Body.Close()
					}
					if !errors.Is(a.Err, ErrAttemptTimeout) {
						t.Fatalf("got %v; want the Override's timeout to cut the attempt", a.Err)
					}
				}
				if got, cut := attempt(t, tr); cut || got != 100*time.Millisecond {
					t.Errorf("after 2000 attempts cut by an Override: an attempt of 100ms cut %v after %v; want answered after 100ms", cut, got)
				}
			})
		})
	}
}

func TestPropagateDeadlinePermitWait(t *testing.T) {
	// Attempts take 100ms: after 20 the least an attempt needs is 81.92ms.
	// The limiter gives a permit every 8.5ms. A request that gets the
	// permit after another one's waits 8.5ms for it (within the tenth of
	// its time left it may wait): with 90ms left, the wait and the attempt
	// end past its deadline. It is refused at once, and sends nothing.
	synctest.Test(t, func(t *testing.T) {
		base := &headers{answers: []int{200}, delay: 100 * time.Millisecond}
		lim := &RateLimiter{}
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{PropagateDeadline: true}}
		warm(t, tr, 20)
		holdAt(lim, 1/0.0085, time.Hour)
		done := make(chan struct{})
		defer func() { <-done }()
		go func() { // takes the permit due now
			defer close(done)
			if resp, err := tr.RoundTrip(newReq(t, "GET", "")); err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Millisecond)
		defer cancel()
		start := time.Now()
		resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopDeadline || re.Attempts != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got (%v, %v); want an *Error, %v after 0 attempts, wrapping context.DeadlineExceeded", resp, err, StopDeadline)
		}
		if got := time.Since(start); got != 0 {
			t.Errorf("got %v elapsed; want 0 (refused at once)", got)
		}
		synctest.Wait()
		if got := len(base.values()); got != 21 {
			t.Errorf("got %d attempts; want 21 (none from the refused request)", got)
		}
	})
}

func TestPropagateDeadlineRetryPermitWait(t *testing.T) {
	// Attempts take 100ms and answer 503: after 20 of 200, the least an
	// attempt needs is 81.92ms. The limiter gives a permit every 108.5ms.
	// The first attempt takes the one at 0; the retry, due at 100ms, would
	// wait 8.5ms (within a tenth of its 90ms left) for the one at 108.5ms,
	// and end no sooner than 190.42ms, past the 190ms deadline. It is not
	// waited for: the last 503 is returned at 100ms.
	synctest.Test(t, func(t *testing.T) {
		answers := make([]int, 21)
		for i := range 20 {
			answers[i] = 200
		}
		answers[20] = 503
		base := &headers{answers: answers, delay: 100 * time.Millisecond}
		lim := &RateLimiter{}
		var decisions []Decision
		tr := &Transport{Base: base, Limiter: lim, Budget: newTokenBucket(1 << 30),
			Policy: Policy{PropagateDeadline: true, BaseDelay: time.Nanosecond, Rand: lowRand}}
		warm(t, tr, 20)
		holdAt(lim, 1/0.1085, time.Hour)
		tr.OnAttempt = func(a Attempt) { decisions = append(decisions, a.Decision) }
		ctx, cancel := context.WithTimeout(context.Background(), 190*time.Millisecond)
		defer cancel()
		start := time.Now()
		code, _, err := roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
		if err != nil || code != 503 {
			t.Fatalf("got (%d, %v); want the 503", code, err)
		}
		if got := time.Since(start); got != 100*time.Millisecond {
			t.Errorf("got %v elapsed; want 100ms", got)
		}
		if len(decisions) != 1 || decisions[0] != StopDeadline {
			t.Errorf("got decisions %v; want [%v]", decisions, StopDeadline)
		}
	})
}

func TestPropagateDeadlineAttemptTimeout(t *testing.T) {
	// An attempt cut by its timeout is given up by its caller: the header
	// tells the time the attempt has, the sooner of the request's deadline
	// and the attempt timeout, as Envoy's per-try timeout does.
	tests := []struct {
		name     string
		policy   Policy
		override Override
		deadline time.Duration // the context's; 0 for none
		want     string
	}{
		{"AttemptTimeout sooner than the deadline", Policy{AttemptTimeout: 300 * time.Millisecond}, Override{}, time.Second, "300 300"},
		{"the deadline sooner than AttemptTimeout", Policy{AttemptTimeout: 2 * time.Second}, Override{}, time.Second, "1000 900"},
		{"AttemptTimeout without a deadline", Policy{AttemptTimeout: 300 * time.Millisecond}, Override{}, 0, "300 300"},
		{"the Override's AttemptTimeout", Policy{AttemptTimeout: 300 * time.Millisecond}, Override{AttemptTimeout: 50 * time.Millisecond}, time.Second, "50 50"},
		{"hedged copies, each under AttemptTimeout", Policy{AttemptTimeout: 300 * time.Millisecond, HedgeDelay: 20 * time.Millisecond, HedgeRatio: 1}, Override{}, time.Second, "300 300"},
		{"no deadline, no AttemptTimeout: no header", Policy{}, Override{}, 0, "- -"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &headers{answers: []int{503, 200}, delay: 40 * time.Millisecond}
				p := tc.policy
				p.PropagateDeadline = true
				p.BaseDelay, p.Rand = 60*time.Millisecond, highRand // 40ms, a 60ms wait, 40ms
				tr := &Transport{Base: base, Policy: p}
				ctx := WithOverride(context.Background(), tc.override)
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
				time.Sleep(time.Second)
				synctest.Wait()
				if got := strings.Join(base.values(), " "); got != tc.want {
					t.Errorf("got headers %q; want %q", got, tc.want)
				}
			})
		})
	}
}

func TestPropagateDeadlineHedgeTooLate(t *testing.T) {
	// Attempts take 100ms: after 20, the least an attempt needs is 81.92ms.
	// A hedge is due 50ms after the first copy. With 130ms left, the first
	// copy may end in time; a hedge at 50ms could not (131.92ms): it is not
	// sent. With 200ms left it is.
	tests := []struct {
		left time.Duration
		want string
	}{
		{130 * time.Millisecond, "130"},
		{200 * time.Millisecond, "200 150"},
	}
	for _, tc := range tests {
		t.Run(tc.left.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &headers{answers: []int{200}, delay: 100 * time.Millisecond}
				tr := &Transport{Base: base, Policy: Policy{PropagateDeadline: true, HedgeDelay: 50 * time.Millisecond, HedgeRatio: 1}}
				warm(t, tr, 20)
				ctx, cancel := context.WithTimeout(context.Background(), tc.left)
				defer cancel()
				roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
				time.Sleep(time.Second)
				synctest.Wait()
				if got := strings.Join(base.values()[20:], " "); got != tc.want {
					t.Errorf("got headers %q; want %q", got, tc.want)
				}
			})
		})
	}
}

func TestPropagateDeadlinePermitVoided(t *testing.T) {
	// Attempts take 7s: after 20 the least an attempt needs is 6.5536s.
	// With 7s left, the permit due at 5ms would do. The request waits for
	// it; a throttle at 3ms voids it (a cut makes a new schedule), and the
	// one it asks for again comes near 588ms, within the tenth of the time
	// left it may wait: the attempt could no longer end in time. It is not
	// sent: the request ends with StopDeadline when the first wait ends.
	synctest.Test(t, func(t *testing.T) {
		var sent []string
		var mu sync.Mutex
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			mu.Lock()
			sent = append(sent, r.URL.Path)
			mu.Unlock()
			if r.URL.Path == "/throttled" {
				time.Sleep(3 * time.Millisecond)
				return &http.Response{StatusCode: 429, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			}
			time.Sleep(7 * time.Second)
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		lim := &RateLimiter{}
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{PropagateDeadline: true}}
		warm(t, tr, 20)
		holdAt(lim, 200, time.Hour)
		done := make(chan struct{})
		go func() { // takes the permit due now; its 429 at 3ms cuts the rate
			defer close(done)
			ctx := WithOverride(context.Background(), Override{MaxAttempts: 1})
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/throttled", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}()
		synctest.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 7*time.Second)
		defer cancel()
		start := time.Now()
		resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
		<-done
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopDeadline || re.Attempts != 0 || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got (%v, %v) after %v; want an *Error, %v after 0 attempts, wrapping context.DeadlineExceeded", resp, err, time.Since(start), StopDeadline)
		}
		if got := time.Since(start); got != 5*time.Millisecond {
			t.Errorf("got %v elapsed; want 5ms (the voided permit's wait)", got)
		}
		if got := len(sent); got != 21 {
			t.Errorf("got %d attempts; want 21 (none from the refused request)", got)
		}
	})
}

func TestPropagateDeadlineFailFastNeverRefusesInTime(t *testing.T) {
	// A refused attempt would have ended in time at most one time in ten.
	// Every attempt here takes exactly its latency: with a microsecond more
	// than that left, each would end in time, and it must be sent.
	for _, latency := range []time.Duration{3 * time.Millisecond, 100 * time.Millisecond, 900 * time.Millisecond, 10 * time.Second} {
		t.Run(latency.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &headers{answers: []int{200}, delay: latency}
				tr := &Transport{Base: base, Policy: Policy{PropagateDeadline: true}}
				warm(t, tr, 20)
				ctx, cancel := context.WithTimeout(context.Background(), latency+time.Microsecond)
				defer cancel()
				start := time.Now()
				code, _, err := roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
				if err != nil || code != 200 {
					t.Fatalf("with %v left: got (%d, %v); want the 200", latency+time.Microsecond, code, err)
				}
				if got := time.Since(start); got != latency {
					t.Errorf("got the answer after %v; want %v, in time", got, latency)
				}
			})
		})
	}
}

func TestHandlerBehindTimeoutHandler(t *testing.T) {
	// http.TimeoutHandler's deadline is the service's ceiling: Handler inside
	// it shortens it to the header's, never extends it. Outside it, the
	// sooner of the two ends the work.
	tests := []struct {
		name   string
		outer  bool // Handler around TimeoutHandler, not inside it
		header string
		want   time.Duration
	}{
		{"inside, header sooner", false, "50", 45 * time.Millisecond},
		{"inside, header later", false, "500", 100 * time.Millisecond},
		{"outside, header sooner", true, "50", 45 * time.Millisecond},
		{"outside, header later", true, "500", 100 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var left time.Duration
				inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					d, _ := r.Context().Deadline()
					left = time.Until(d)
				})
				var h http.Handler
				if tc.outer {
					h = Handler(http.TimeoutHandler(inner, 100*time.Millisecond, "timeout"))
				} else {
					h = http.TimeoutHandler(Handler(inner), 100*time.Millisecond, "timeout")
				}
				r := httptest.NewRequest("GET", "/", nil)
				r.Header.Set("Request-Timeout-Ms", tc.header)
				h.ServeHTTP(httptest.NewRecorder(), r)
				if left != tc.want {
					t.Errorf("got %v left in the handler; want %v", left, tc.want)
				}
			})
		})
	}
}

func TestDeadlinesConcurrent(t *testing.T) {
	// Every option of this file at once, from 8 goroutines, across two
	// hosts: under -race, no race, every request ends, and nothing is left
	// running once the answers are read (synctest fails on a goroutine
	// left blocked).
	synctest.Test(t, func(t *testing.T) {
		var n atomic.Int64
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			d := time.Duration(1+n.Add(1)%7) * 10 * time.Millisecond
			if r.URL.Host == "slow.test" {
				d *= 5
			}
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-timer.C:
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			code := 200
			if n.Load()%11 == 0 {
				code = 503
			}
			return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		tr := &Transport{Base: base, PerHost: &PerHost{Limiter: func(string) *RateLimiter { return &RateLimiter{} }},
			Policy: Policy{PropagateDeadline: true, HedgeQuantile: 0.9, HedgeRatio: 0.2,
				AttemptTimeout: time.Second, AttemptTimeoutQuantile: 0.99}}
		var wg sync.WaitGroup
		for g := range 8 {
			wg.Go(func() {
				for i := range 200 {
					host := "fast.test"
					if (g+i)%3 == 0 {
						host = "slow.test"
					}
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(50+i%400)*time.Millisecond)
					req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+host+"/", nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
					}
					cancel()
				}
			})
		}
		wg.Wait()
		time.Sleep(time.Minute) // losing copies end
		synctest.Wait()
	})
}
