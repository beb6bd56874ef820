package retryhttp

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
	"github.com/stretchr/testify/require"
)

func TestRetryableOutcomesAreRetried(t *testing.T) {
	tests := []struct {
		name      string
		method    string
		first     rht.Step
		maxWindow time.Duration // the first wait lies in [0, maxWindow]
		cost      int
	}{
		{"502", "GET", rht.Status(502), 50 * time.Millisecond, RetryCost},
		{"503", "GET", rht.Status(503), 50 * time.Millisecond, RetryCost},
		{"504", "GET", rht.Status(504), 50 * time.Millisecond, RetryCost},
		{"429 throttling", "GET", rht.Status(429), time.Second, ThrottleRetryCost},
		{"connection reset", "GET", rht.Step{Err: errReset}, 50 * time.Millisecond, RetryCost},
		{"503 POST", "POST", rht.Status(503), 50 * time.Millisecond, RetryCost},
		{"503 PUT", "PUT", rht.Status(503), 50 * time.Millisecond, RetryCost},
		{"503 DELETE", "DELETE", rht.Status(503), 50 * time.Millisecond, RetryCost},
		{"503 PATCH", "PATCH", rht.Status(503), 50 * time.Millisecond, RetryCost},
	}
	for _, tc := range tests {
		for _, rnd := range []struct {
			name string
			fn   func(int64) int64
			want func(max time.Duration) time.Duration
		}{
			{"high", highRand, func(m time.Duration) time.Duration { return m }},
			{"low", lowRand, func(time.Duration) time.Duration { return 0 }},
		} {
			t.Run(tc.name+"/"+rnd.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := rht.NewTransport(tc.first, rht.Status(200).WithBody("ok"))
					var hooks []Attempt
					tr := &Transport{Base: base, Policy: Policy{Rand: rnd.fn},
						OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
					code, body, err := roundTrip(t, tr, newReq(t, tc.method, "payload"))
					if err != nil || code != 200 || body != "ok" {
						t.Fatalf("got (%d, %q, %v); want (200, \"ok\", nil)", code, body, err)
					}
					as := base.Attempts()
					if len(as) != 2 {
						t.Fatalf("got %d attempts; want 2", len(as))
					}
					if gap, want := rht.Gaps(base)[0], rnd.want(tc.maxWindow); gap != want {
						t.Errorf("got wait %v; want %v (window [0, %v])", gap, want, tc.maxWindow)
					}
					if as[0].Body != "payload" || as[1].Body != "payload" {
						t.Errorf("got bodies %q, %q; want the payload twice", as[0].Body, as[1].Body)
					}
					keys := rht.Keys(base)
					if tc.method == "POST" || tc.method == "PATCH" {
						if keys[0] == "" || keys[0] != keys[1] {
							t.Errorf("got keys %q; want one key sent on both attempts", keys)
						}
					} else if keys[0] != "" || keys[1] != "" {
						t.Errorf("got keys %q on an idempotent %s; want none", keys, tc.method)
					}
					// The retry took its cost and gave it back on success.
					if got := tr.budgetInUse().Available(); got != DefaultBudgetTokens {
						t.Errorf("got %d tokens after a successful retry; want %d", got, DefaultBudgetTokens)
					}
					if len(hooks) != 2 || hooks[0].Decision != Retry || hooks[1].Decision != Done {
						t.Fatalf("got hook decisions %v; want [retry done]", decisions(hooks))
					}
					if got, want := hooks[0].tokens, DefaultBudgetTokens-tc.cost; got != want {
						t.Errorf("got %d tokens after the retry was paid; want %d", got, want)
					}
					if base.OpenBodies() != 0 {
						t.Errorf("got %d response bodies left open; want 0", base.OpenBodies())
					}
				})
			})
		}
	}
}

func decisions(as []Attempt) []string {
	var s []string
	for _, a := range as {
		s = append(s, a.Decision.String())
	}
	return s
}

func TestPermanentOutcomesAreNotRetried(t *testing.T) {
	for _, code := range []int{400, 401, 403, 404, 405, 408, 409, 410, 422, 500, 501, 505} {
		t.Run(http.StatusText(code), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(rht.Status(code).WithBody("no"), rht.Status(200))
				tr := &Transport{Base: base}
				got, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
				if err != nil || got != code || body != "no" {
					t.Fatalf("got (%d, %q, %v); want (%d, \"no\", nil)", got, body, err, code)
				}
				if n := len(base.Attempts()); n != 1 {
					t.Errorf("got %d attempts; want 1", n)
				}
				if got := tr.budgetInUse().Available(); got != DefaultBudgetTokens {
					t.Errorf("got %d tokens; want %d", got, DefaultBudgetTokens)
				}
			})
		})
	}
}

func TestCustomClassifierRetries500(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(500), rht.Status(408), rht.Status(200))
		tr := &Transport{Base: base, Policy: Policy{Classify: func(resp *http.Response, err error) Class {
			if resp != nil && (resp.StatusCode == 500 || resp.StatusCode == 408) {
				return Transient
			}
			return DefaultClassify(resp, err)
		}}}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || code != 200 || len(base.Attempts()) != 3 {
			t.Fatalf("got (%d, %v) after %d attempts; want (200, nil) after 3", code, err, len(base.Attempts()))
		}
	})
}

func TestAttemptsExhausted(t *testing.T) {
	t.Run("response", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Status(503).WithBody("down"))
			tr := &Transport{Base: base}
			code, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
			if err != nil || code != 503 || body != "down" {
				t.Fatalf("got (%d, %q, %v); want the last 503 with a nil error", code, body, err)
			}
			if n := len(base.Attempts()); n != 3 {
				t.Errorf("got %d attempts; want 3", n)
			}
			if got, want := tr.budgetInUse().Available(), DefaultBudgetTokens-2*RetryCost; got != want {
				t.Errorf("got %d tokens; want %d", got, want)
			}
		})
	})
	t.Run("error", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Step{Err: errReset})
			tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 5}}
			_, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
			var re *Error
			if !errors.As(err, &re) {
				t.Fatalf("got %v; want an *Error", err)
			}
			if re.Attempts != 5 || re.Decision != StopAttempts {
				t.Errorf("got %d attempts, %v; want 5, %v", re.Attempts, re.Decision, StopAttempts)
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Errorf("got %v; want it to wrap ECONNRESET", err)
			}
			if want := "retryhttp: attempts exhausted after 5 attempts: read tcp: connection reset by peer"; err.Error() != want {
				t.Errorf("got %q; want %q", err.Error(), want)
			}
		})
	})
}

func TestBackoffSchedule(t *testing.T) {
	tests := []struct {
		name   string
		policy Policy
		first  rht.Step
		want   []time.Duration
	}{
		{"no jitter doubles from 50ms", Policy{MaxAttempts: 5, Rand: highRand}, rht.Status(503),
			[]time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond}},
		{"full jitter at its ceiling", Policy{MaxAttempts: 4, Rand: highRand}, rht.Status(503),
			[]time.Duration{50 * time.Millisecond, 100 * time.Millisecond, 200 * time.Millisecond}},
		{"throttling doubles from 1s", Policy{MaxAttempts: 4, Rand: highRand}, rht.Status(429),
			[]time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
		{"capped by MaxDelay", Policy{MaxAttempts: 5, Rand: highRand, MaxDelay: 3 * time.Second}, rht.Status(429),
			[]time.Duration{time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second}},
		{"equal jitter at its floor", Policy{MaxAttempts: 4, Jitter: EqualJitter, Rand: lowRand}, rht.Status(503),
			[]time.Duration{25 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond}},
		{"decorrelated at its ceiling", Policy{MaxAttempts: 4, Jitter: DecorrelatedJitter, Rand: highRand}, rht.Status(503),
			[]time.Duration{150 * time.Millisecond, 450 * time.Millisecond, 1350 * time.Millisecond}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.first)
				tr := &Transport{Base: base, Policy: tc.policy, Budget: newTokenBucket(math.MaxInt)}
				roundTrip(t, tr, newReq(t, "GET", ""))
				if got := rht.Gaps(base); !reflect.DeepEqual(got, tc.want) {
					t.Errorf("got waits %v; want %v", got, tc.want)
				}
			})
		})
	}
}

func TestDeadline(t *testing.T) {
	t.Run("Policy.Timeout: a wait that cannot end in time is not started", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Status(503))
			var last Attempt
			tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 10, Rand: highRand, Timeout: 120 * time.Millisecond},
				OnAttempt: func(a Attempt) { last = a }}
			start := time.Now()
			code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
			if err != nil || code != 503 {
				t.Fatalf("got (%d, %v); want the 503 with a nil error", code, err)
			}
			// Waits of 50ms, then 100ms would end at 150ms > 120ms.
			if got := time.Since(start); got != 50*time.Millisecond {
				t.Errorf("got %v elapsed; want 50ms", got)
			}
			if n := len(base.Attempts()); n != 2 {
				t.Errorf("got %d attempts; want 2", n)
			}
			if last.Decision != StopDeadline || last.Delay != 100*time.Millisecond {
				t.Errorf("got last decision %v with delay %v; want %v with 100ms", last.Decision, last.Delay, StopDeadline)
			}
			if got, want := tr.budgetInUse().Available(), DefaultBudgetTokens-RetryCost; got != want {
				t.Errorf("got %d tokens; want %d (a refused wait costs nothing)", got, want)
			}
		})
	})
	t.Run("context deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Step{Err: errReset})
			tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 10, Rand: highRand, BaseDelay: 100 * time.Millisecond}}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			start := time.Now()
			_, _, err := roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
			// Waits 100, 200, 400 end at 700ms; 800 more would pass 1s.
			if got := time.Since(start); got != 700*time.Millisecond {
				t.Errorf("got %v elapsed; want 700ms", got)
			}
			var re *Error
			if !errors.As(err, &re) || re.Decision != StopDeadline || re.Attempts != 4 {
				t.Errorf("got %v; want an *Error after 4 attempts, %v", err, StopDeadline)
			}
		})
	})
	t.Run("cancelled mid-wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Status(429))
			tr := &Transport{Base: base, Policy: Policy{Rand: highRand}}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(20*time.Millisecond, cancel)
			start := time.Now()
			resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
			if resp != nil {
				t.Fatalf("got a response; want none")
			}
			if got := time.Since(start); got != 20*time.Millisecond {
				t.Errorf("got %v elapsed; want 20ms", got)
			}
			var re *Error
			if !errors.Is(err, context.Canceled) || !errors.As(err, &re) || re.Decision != StopCanceled || re.Attempts != 1 {
				t.Errorf("got %v; want an *Error wrapping context.Canceled after 1 attempt", err)
			}
			if base.OpenBodies() != 0 {
				t.Errorf("got %d bodies open; want 0", base.OpenBodies())
			}
		})
	})
	t.Run("Policy.Timeout mid-wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Step{Err: errReset})
			// The deadline check uses the wait drawn: 0 with lowRand, so the
			// transport keeps trying until an attempt itself runs into it.
			tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 3, Timeout: time.Second, Rand: lowRand}}
			_, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
			var re *Error
			if !errors.As(err, &re) || re.Decision != StopAttempts {
				t.Errorf("got %v; want %v", err, StopAttempts)
			}
		})
	})
}

func TestCancellation(t *testing.T) {
	t.Run("already cancelled: no attempt, body closed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport()
			tr := &Transport{Base: base}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			body := &closeCounter{Reader: strings.NewReader("x")}
			req := newReq(t, "POST", "").WithContext(ctx)
			req.Body = body
			_, err := tr.RoundTrip(req)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("got %v; want context.Canceled", err)
			}
			if n := len(base.Attempts()); n != 0 {
				t.Errorf("got %d attempts; want 0", n)
			}
			if body.closes != 1 {
				t.Errorf("got %d closes of the request body; want 1", body.closes)
			}
		})
	})
	t.Run("cancelled during an attempt", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Hang())
			tr := &Transport{Base: base}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
			var re *Error
			if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &re) || re.Decision != StopCanceled {
				t.Errorf("got %v; want %v wrapping context.DeadlineExceeded", err, StopCanceled)
			}
			if n := len(base.Attempts()); n != 1 {
				t.Errorf("got %d attempts; want 1", n)
			}
		})
	})
}

type closeCounter struct {
	io.Reader
	mu     sync.Mutex
	closes int
}

func (c *closeCounter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closes++
	return nil
}

func TestAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Hang(), rht.Status(200).WithBody("late but whole"))
		var hooks []Attempt
		tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: 2 * time.Second, Rand: lowRand},
			OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		resp, err := tr.RoundTrip(newReq(t, "GET", ""))
		require.NoError(t, err)
		if len(hooks) != 2 || !errors.Is(hooks[0].Err, ErrAttemptTimeout) || hooks[0].Class != Transient {
			t.Fatalf("got hooks %+v; want a Transient ErrAttemptTimeout, then success", hooks)
		}
		if hooks[0].Duration != 2*time.Second {
			t.Errorf("got first attempt duration %v; want 2s", hooks[0].Duration)
		}
		// Well past the attempt timeout, the returned body still reads.
		time.Sleep(10 * time.Second)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(b) != "late but whole" {
			t.Errorf("got (%q, %v) reading the body; want the whole body", b, err)
		}
		if base.OpenBodies() != 0 {
			t.Errorf("got %d bodies open; want 0", base.OpenBodies())
		}
	})
}

func TestTimeoutReleasedOnBodyClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(200).WithBody("hello"))
		tr := &Transport{Base: base, Policy: Policy{Timeout: time.Minute}}
		resp, err := tr.RoundTrip(newReq(t, "GET", ""))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		if err != nil || string(b) != "hello" {
			t.Fatalf("got (%q, %v); want hello", b, err)
		}
		ctx := resp.Request.Context()
		if ctx.Err() != nil {
			t.Fatalf("context ended before Close: %v", ctx.Err())
		}
		resp.Body.Close()
		if ctx.Err() == nil {
			t.Errorf("the Timeout's context is still live after Close; want it released")
		}
	})
}

func TestServerRequestedDelay(t *testing.T) {
	date := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(http.TimeFormat) }
	tests := []struct {
		name     string
		first    func() rht.Step
		policy   Policy
		attempts int
		minWait  time.Duration
		maxWait  time.Duration
		last     Decision
		server   bool
	}{
		{"429 Retry-After seconds", func() rht.Step { return rht.Status(429).WithHeader("Retry-After", "2") }, Policy{},
			2, 2 * time.Second, 2200 * time.Millisecond, Done, true},
		{"503 Retry-After date", func() rht.Step { return rht.Status(503).WithHeader("Retry-After", date(3*time.Second)) }, Policy{},
			2, 3 * time.Second, 3300 * time.Millisecond, Done, true},
		{"x-amz-retry-after milliseconds", func() rht.Step { return rht.Status(503).WithHeader("x-amz-retry-after", "1500") }, Policy{},
			2, 1500 * time.Millisecond, 1650 * time.Millisecond, Done, true},
		{"retry-after-ms", func() rht.Step { return rht.Status(429).WithHeader("retry-after-ms", "250") }, Policy{},
			2, 250 * time.Millisecond, 300 * time.Millisecond, Done, true}, // spread: BaseDelay, above 10%
		{"past date: spread over BaseDelay", func() rht.Step { return rht.Status(503).WithHeader("Retry-After", date(-time.Hour)) }, Policy{},
			2, 0, 50 * time.Millisecond, Done, true},
		{"Retry-After 0: spread over BaseDelay", func() rht.Step { return rht.Status(503).WithHeader("Retry-After", "0") }, Policy{},
			2, 0, 50 * time.Millisecond, Done, true},
		{"invalid value: backoff", func() rht.Step { return rht.Status(503).WithHeader("Retry-After", "soon") }, Policy{},
			2, 0, 50 * time.Millisecond, Done, false},
		{"longer than MaxDelay: returned at once", func() rht.Step { return rht.Status(429).WithHeader("Retry-After", "30") }, Policy{},
			1, 0, 0, StopServerDelay, true},
		{"within a raised MaxServerDelay", func() rht.Step { return rht.Status(429).WithHeader("Retry-After", "30") }, Policy{MaxServerDelay: time.Minute},
			2, 30 * time.Second, 33 * time.Second, Done, true},
		{"ignored when MaxServerDelay < 0", func() rht.Step { return rht.Status(429).WithHeader("Retry-After", "30") }, Policy{MaxServerDelay: -1},
			2, 0, time.Second, Done, false},
		{"past the deadline: returned at once", func() rht.Step { return rht.Status(503).WithHeader("Retry-After", "5") }, Policy{Timeout: 4 * time.Second},
			1, 0, 0, StopDeadline, true},
	}
	for _, tc := range tests {
		// Each case runs at both ends of the random spread, so the waits
		// are exact: lowRand gives the requested delay, highRand that plus
		// 10% or BaseDelay, whichever is more (or the backoff ceiling,
		// where backoff applies).
		for _, end := range []struct {
			name string
			rnd  func(int64) int64
		}{{"low", lowRand}, {"high", highRand}} {
			t.Run(tc.name+"/"+end.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					base := rht.NewTransport(tc.first(), rht.Status(200))
					var hooks []Attempt
					p := tc.policy
					p.Rand = end.rnd
					tr := &Transport{Base: base, Policy: p, OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
					start := time.Now()
					code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
					require.NoError(t, err)
					if n := len(base.Attempts()); n != tc.attempts {
						t.Fatalf("got %d attempts; want %d", n, tc.attempts)
					}
					want := tc.minWait
					if end.name == "high" {
						want = tc.maxWait
					}
					if tc.attempts == 1 {
						if code == 200 || time.Since(start) != 0 {
							t.Errorf("got %d after %v; want the retryable response at once", code, time.Since(start))
						}
					} else if gap := rht.Gaps(base)[0]; gap != want {
						t.Errorf("got wait %v; want %v", gap, want)
					}
					if got := hooks[len(hooks)-1].Decision; got != tc.last {
						t.Errorf("got final decision %v; want %v", got, tc.last)
					}
					if tc.attempts == 2 && hooks[0].ServerDelay != tc.server {
						t.Errorf("got server delay %v; want %v", hooks[0].ServerDelay, tc.server)
					}
				})
			})
		}
	}
}

func TestBudgetExactCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := newTokenBucket(40)
		tokens := b.Available()
		steps := []struct {
			name         string
			script       []rht.Step
			times        int
			wantAttempts int // per request
			wantCode     int
			wantDelta    int // tokens after minus before, over all the requests
		}{
			{"outage: two retries at 14 each, spent for good", []rht.Step{rht.Status(503)}, 1, 3, 503, -28},
			{"12 tokens cannot pay a transient retry", []rht.Step{rht.Status(503)}, 1, 1, 503, 0},
			{"throttling retries cost 5 each", []rht.Step{rht.Status(429)}, 1, 3, 429, -10},
			{"a first-try success adds 1", []rht.Step{rht.Status(200)}, 1, 1, 200, +1},
			{"3 tokens cannot pay either", []rht.Step{rht.Status(503), rht.Status(200)}, 1, 1, 503, 0},
			{"successes refill one token each", []rht.Step{rht.Status(200)}, 11, 1, 200, +11},
			{"a successful retry refunds its cost", []rht.Step{rht.Status(503), rht.Status(200)}, 1, 2, 200, 0},
			{"refill up to capacity", []rht.Step{rht.Status(200)}, 26, 1, 200, +26},
			{"never above capacity", []rht.Step{rht.Status(200)}, 5, 1, 200, 0},
		}
		for _, st := range steps {
			for i := 0; i < st.times; i++ {
				base := rht.NewTransport(st.script...)
				tr := &Transport{Base: base, Budget: b, Policy: Policy{Rand: lowRand}}
				code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
				if err != nil || code != st.wantCode {
					t.Fatalf("%s: got (%d, %v); want (%d, nil)", st.name, code, err, st.wantCode)
				}
				if n := len(base.Attempts()); n != st.wantAttempts {
					t.Errorf("%s: got %d attempts; want %d", st.name, n, st.wantAttempts)
				}
			}
			if got := b.Available() - tokens; got != st.wantDelta {
				t.Errorf("%s: got token change %+d; want %+d", st.name, got, st.wantDelta)
			}
			tokens = b.Available()
		}
		if tokens != 40 {
			t.Errorf("got %d tokens at the end; want 40", tokens)
		}
	})
}

func TestBudgetRefusalIsImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Step{Err: errReset})
		var hooks []Attempt
		tr := &Transport{Base: base, Budget: newTokenBucket(RetryCost - 1), OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		start := time.Now()
		_, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopBudget || re.Attempts != 1 {
			t.Fatalf("got %v; want an *Error, %v after 1 attempt", err, StopBudget)
		}
		if !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("got %v; want it to wrap the attempt's error", err)
		}
		if d := time.Since(start); d != 0 {
			t.Errorf("got %v elapsed; want 0 (no wait when the budget refuses)", d)
		}
		if len(hooks) != 1 || hooks[0].tokens != RetryCost-1 {
			t.Errorf("got hooks %+v; want one with %d tokens", hooks, RetryCost-1)
		}
	})
}

func TestBrokenBaseNeitherResponseNorError(t *testing.T) {
	tr := &Transport{Base: roundTripperFunc(func(*http.Request) (*http.Response, error) { return nil, nil })}
	resp, err := tr.RoundTrip(newReq(t, "GET", ""))
	if resp != nil || !errors.Is(err, errNoResponse) {
		t.Errorf("got (%v, %v); want (nil, an error wrapping errNoResponse)", resp, err)
	}
}

func TestFieldsSetAfterAnEarlyMethodCall(t *testing.T) {
	// BudgetInUse and CloseIdleConnections may be called before the hooks
	// and the Policy are set (otelretry's Instrument reads the budget and
	// then sets OnAttempt): the requests still see what is set when they
	// are made.
	early := map[string]func(*Transport){
		"BudgetInUse":          func(tr *Transport) { tr.budgetInUse() },
		"CloseIdleConnections": func(tr *Transport) { tr.CloseIdleConnections() },
	}
	for name, call := range early {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				slow := rht.Status(200).WithDelay(100 * time.Millisecond).WithBody("slow")
				base := rht.NewTransport(rht.Status(503), slow, rht.Status(200).WithBody("fast"))
				tr := &Transport{Base: base}
				call(tr)
				var hooks []Attempt
				var logged strings.Builder
				tr.OnAttempt = func(a Attempt) { hooks = append(hooks, a) }
				tr.Logger = slog.New(slog.NewTextHandler(&logged, nil))
				tr.Policy = Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}
				_, body, err := roundTrip(t, tr, newReq(t, "GET", ""))
				if err != nil {
					t.Fatal(err)
				}
				if body != "fast" || len(hooks) != 2 || hooks[1].Hedges != 1 || !hooks[1].HedgeWon {
					t.Errorf("got body %q and hooks %+v; want the hedge's body and two hook calls, the second reporting a hedge that won", body, hooks)
				}
				if got := strings.Count(logged.String(), "\n"); got != 2 {
					t.Errorf("got %d log lines; want 2 (the retry and the attempt after it)", got)
				}
				synctest.Wait()
			})
		})
	}
}

// A keyed POST through hedging, a limiting Limiter, SendAttemptHeader and a
// Timeout, retried after a 429 and a 503: the caller's request (its header,
// context, body and GetBody) is as it was, and its body is closed once.
func TestCallerRequestUntouchedThroughEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		holdAt(lim, 100, time.Hour)
		base := rht.NewTransport(rht.Status(429).WithDelay(20*time.Millisecond), rht.Status(503).WithDelay(20*time.Millisecond), rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1,
			SendAttemptHeader: true, Timeout: 10 * time.Second, Rand: lowRand}}
		var closes atomic.Int32
		req := newReq(t, "POST", "")
		req.Body = &countClose{Reader: strings.NewReader("x"), n: &closes}
		req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader("x")), nil }
		req.Header.Set("X-Mine", "1")
		before := req.Header.Clone()
		ctx, body := req.Context(), req.Body
		code, _, err := roundTrip(t, tr, req)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200", code, err)
		}
		if !reflect.DeepEqual(req.Header, before) || req.Context() != ctx || req.Body != body {
			t.Errorf("the caller's request changed: header %v (was %v)", req.Header, before)
		}
		if n := closes.Load(); n != 1 {
			t.Errorf("the caller's body was closed %d times; want 1", n)
		}
		rht.AssertAttempts(t, base, 3)
		rht.AssertStableKey(t, base)
	})
}
