package retryhttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

var t0 = time.Date(2026, 11, 29, 0, 0, 0, 0, time.UTC)

// seventh is the interval of a rate of 7 permits per second, in whole
// nanoseconds as the limiter spaces them.
var seventh = time.Duration(second / 7)

var second = float64(time.Second)

// sendSteadily takes n permits spaced by gap from start; it returns the
// time after the last.
func sendSteadily(t *testing.T, l *RateLimiter, start time.Time, n int, gap time.Duration) time.Time {
	t.Helper()
	now := start
	for range n {
		at, epoch, ok := reserveAt(l, now, time.Time{})
		if !ok || !at.Equal(now) {
			t.Fatalf("permit at %v: got (%v, %v); want one at once", now.Sub(t0), at.Sub(t0), ok)
		}
		if epoch != 0 {
			t.Fatalf("got epoch %d before any throttle; want 0", epoch)
		}
		now = now.Add(gap)
	}
	return now
}

// curve is the rate the limiter documents, dt after a cut that took drop
// of wmax off, for the default Recovery.
func curve(wmax, drop float64, dt time.Duration) float64 {
	k := DefaultLimiterRecovery.Seconds() * math.Cbrt(wmax/10)
	x := (dt.Seconds() - k) / k
	return wmax * (1 + drop*x*x*x)
}

func near(got, want float64) bool { return math.Abs(got-want) < 1e-9*max(1, math.Abs(want)) }

func TestRateLimiterCurve(t *testing.T) {
	// 20 permits a second for a second (the measured rate: 20), then a
	// throttle while most attempts get through: the rate drops to 0.7 x 20
	// and grows back along the cubic to 20 after Recovery x cbrt(20/10).
	l := &RateLimiter{}
	now := sendSteadily(t, l, t0, 20, 50*time.Millisecond)
	const epoch = 0 // before the first cut
	l.throttled(epoch, now)
	cut := now
	k := time.Duration(float64(DefaultLimiterRecovery) * math.Cbrt(2))
	tests := []struct {
		name  string
		after time.Duration
		want  float64
	}{
		{"at the cut: Beta times the measured rate", 0, 14},
		{"half-way back: the concave part", k / 2, 20 * (1 - 0.3/8)},
		{"after Recovery x cbrt(rate/10): back where the throttle came", k, 20},
		{"then probing beyond it", 2 * k, 26},
		{"never above twice the measured rate", 3 * k, 40},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l.mu.Lock()
			got := l.rateAt(cut.Add(tc.after))
			l.mu.Unlock()
			if !near(got, tc.want) {
				t.Errorf("got %v permits/s after %v; want %v", got, tc.after, tc.want)
			}
		})
	}

	t.Run("one cut per round: a throttle of an attempt sent before the cut changes nothing", func(t *testing.T) {
		l.throttled(epoch, cut.Add(time.Millisecond))
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.epoch != 1 || !l.cutAt.Equal(cut) || l.wmax != 20 {
			t.Errorf("got epoch %d, cut at %v, wmax %v; want 1, %v, 20", l.epoch, l.cutAt.Sub(t0), l.wmax, cut.Sub(t0))
		}
	})
}

func TestRateLimiterCutsOncePerRound(t *testing.T) {
	l := &RateLimiter{}
	now := sendSteadily(t, l, t0, 10, 10*time.Millisecond)
	_, e0, _ := reserveAt(l, now, time.Time{})
	l.throttled(e0, now) // 11 sent in 100 ms: cut to 0.7 x 110/s
	rate := func() float64 {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.rateAt(now)
	}
	if got := rate(); !near(got, 77) {
		t.Errorf("after the first throttle: got %v permits/s; want 77", got)
	}
	for range 20 { // a burst of answers to attempts sent before the cut
		l.throttled(e0, now)
	}
	if got := rate(); !near(got, 77) {
		t.Errorf("after 20 throttles of the same round: got %v permits/s; want 77 still", got)
	}
	_, e1, _ := reserveAt(l, now, time.Time{})
	l.throttled(e1, now) // sent at the new rate: the next round
	if got := rate(); !near(got, 0.7*77) {
		t.Errorf("after a throttle of the next round: got %v permits/s; want 0.7 x 77 (the rate, not the measured 110)", got)
	}
	if st := l.Stats(); st.Cuts != 2 {
		t.Errorf("got %d cuts; want 2", st.Cuts)
	}
}

func TestRateLimiterPermits(t *testing.T) {
	l := &RateLimiter{MinRate: 4}
	// One throttle with nothing measured: 1 permit in at least 100 ms is
	// 10/s, cut to 7/s; the next permit is one interval away.
	_, e, _ := reserveAt(l, t0, time.Time{})
	l.throttled(e, t0)
	first := t0.Add(seventh)
	at, _, ok := reserveAt(l, t0, time.Time{})
	if !ok || !at.Equal(first) {
		t.Fatalf("got a permit at %v (%v); want %v", at.Sub(t0), ok, first.Sub(t0))
	}
	t.Run("spaced at the rate", func(t *testing.T) {
		next, _, _ := reserveAt(l, t0, time.Time{})
		// The rate has grown along the curve in the meantime.
		if gap, want := next.Sub(first), interval(curve(10, 0.3, seventh)); gap != want {
			t.Errorf("got a gap of %v; want %v", gap, want)
		}
	})
	t.Run("after the deadline: refused, and nothing taken", func(t *testing.T) {
		l.mu.Lock()
		next := l.next
		l.mu.Unlock()
		if _, _, ok := reserveAt(l, t0, next); ok {
			t.Error("got a permit due at the deadline; want none")
		}
		if _, _, ok := reserveAt(l, t0, next.Add(time.Nanosecond)); !ok {
			t.Error("got no permit due just before the deadline; want one")
		}
	})
	t.Run("beyond MaxWait: refused", func(t *testing.T) {
		l.MaxWait = 100 * time.Millisecond
		defer func() { l.MaxWait = 0 }()
		if _, _, ok := reserveAt(l, t0, time.Time{}); ok {
			t.Error("got a permit more than MaxWait away; want none")
		}
	})
	t.Run("never below MinRate", func(t *testing.T) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.wmax = 1
		if got := l.rateAt(t0); got != 4 {
			t.Errorf("got %v permits/s; want MinRate, 4", got)
		}
	})
}

// throttledOnce is a base that answers its first request with 429 and every
// other one with 200 after lag.
func throttledOnce(lag time.Duration) (*rht.Transport, []rht.Step) {
	steps := []rht.Step{rht.Status(429), rht.Status(200).WithDelay(lag).Times(50)}
	return rht.NewTransport(steps...), steps
}

func TestTransportWaitsForPermits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, _ := throttledOnce(0)
		lim := &RateLimiter{}
		var hooks []Attempt
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1},
			OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		if code, _, _ := roundTrip(t, tr, newReq(t, "GET", "")); code != 429 {
			t.Fatalf("got %d; want the 429", code)
		}
		if got := lim.Rate(); !near(got, 7) {
			t.Fatalf("got a rate of %v; want 7 (0.7 x 1 sent in 100 ms)", got)
		}
		start := time.Now()
		for range 3 {
			if code, _, err := roundTrip(t, tr, newReq(t, "GET", "")); code != 200 || err != nil {
				t.Fatalf("got (%d, %v); want 200", code, err)
			}
		}
		times := base.Attempts()
		if len(times) != 4 {
			t.Fatalf("got %d attempts; want 4", len(times))
		}
		if got, want := times[1].Time.Sub(start), seventh; got != want {
			t.Errorf("first request after the throttle sent after %v; want %v", got, want)
		}
		for i := 2; i < 4; i++ {
			gap := times[i].Time.Sub(times[i-1].Time)
			if want := interval(curve(10, 0.3, times[i-1].Time.Sub(start))); gap != want {
				t.Errorf("gap %d: got %v; want %v", i, gap, want)
			}
		}
		if a := hooks[1]; a.PermitWait != seventh || !near(a.RateLimit, curve(10, 0.3, seventh)) {
			t.Errorf("got PermitWait %v and RateLimit %v in the hook; want 1/7 s and %v", a.PermitWait, a.RateLimit, curve(10, 0.3, seventh))
		}
	})
}

func TestTransportFailsFastWithoutPermit(t *testing.T) {
	for _, method := range []string{"GET", "POST"} {
		t.Run(method, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base, _ := throttledOnce(0)
				var logs bytes.Buffer
				lim := &RateLimiter{}
				tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
				roundTrip(t, tr, newReq(t, "GET", ""))
				logs.Reset()
				// The next permit is 1/7 s away; the deadline is closer.
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				defer cancel()
				body := &closeCounter{Reader: bytes.NewReader([]byte("payload"))}
				req, _ := http.NewRequestWithContext(ctx, method, "http://example.test/", body)
				var rep Report
				req = req.WithContext(WithReport(req.Context(), &rep))
				start := time.Now()
				resp, err := tr.RoundTrip(req)
				var re *Error
				if resp != nil || !errors.As(err, &re) || !errors.Is(err, ErrRateLimited) {
					t.Fatalf("got (%v, %v); want an *Error wrapping ErrRateLimited", resp, err)
				}
				if re.Attempts != 0 || re.Decision != StopRateLimited || rep.Decision != StopRateLimited {
					t.Errorf("got %d attempts, decision %v (report: %v); want 0, rate limited", re.Attempts, re.Decision, rep.Decision)
				}
				if took := time.Since(start); took != 0 {
					t.Errorf("returned after %v; want at once", took)
				}
				if body.closes != 1 {
					t.Errorf("request body closed %d times; want 1", body.closes)
				}
				rht.AssertAttempts(t, base, 1)
				if st := lim.Stats(); st.Cuts != 1 || st.Refused != 1 || !near(st.Rate, 7) {
					t.Errorf("got stats %+v; want 1 cut, 1 refused, rate 7", st)
				}
				if got := logs.String(); !strings.Contains(got, `level=WARN msg="retryhttp: no send permit" method=`+method) ||
					!strings.Contains(got, "attempt=1 rate_limit=7") {
					t.Errorf("got log %q; want one warning for the attempt not made", got)
				}
			})
		})
	}
}

func TestRetryTakesAPermit(t *testing.T) {
	// A 429, then its retry after the throttle backoff (0 here): the retry
	// takes its permit when it is due, and waits for it.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(429), rht.Status(200))
		var hooks []Attempt
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Policy: Policy{Rand: lowRand},
			OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if code != 200 || err != nil {
			t.Fatalf("got (%d, %v); want 200", code, err)
		}
		if gaps := rht.Gaps(base); len(gaps) != 1 || gaps[0] != seventh {
			t.Errorf("got gaps %v; want [%v]", gaps, seventh)
		}
		if hooks[0].Delay != 0 || hooks[1].PermitWait != seventh {
			t.Errorf("got delay %v and permit wait %v; want 0 (the backoff) and %v", hooks[0].Delay, hooks[1].PermitWait, seventh)
		}
	})
}

func TestRetryPlannedAheadHoldsNoPermit(t *testing.T) {
	// A retry due in 500 ms (retry-after-ms) does not hold a permit in the
	// meantime: another request gets the next one, 1/7 s after the 429.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		base := rht.NewTransport(rht.Status(429).WithHeader("Retry-After-Ms", "500"), rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{Rand: lowRand}}
		other := rht.NewTransport(rht.Status(200))
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) })
		synctest.Wait() // the 429 is in, its retry waits
		roundTrip(t, &Transport{Base: other, Limiter: lim}, newReq(t, "GET", ""))
		if got := other.Attempts()[0].Time.Sub(start); got != seventh {
			t.Errorf("the other request was sent after %v; want %v", got, seventh)
		}
		wg.Wait()
	})
}

func TestRetryWithoutPermitReturnsTheResponse(t *testing.T) {
	// The retry's permit would come after the deadline: the 429 is returned
	// as it is, and the retry's tokens go back.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(429), rht.Status(200))
		budget := NewBudget(500)
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Budget: budget, Policy: Policy{Rand: lowRand, Timeout: 100 * time.Millisecond}}
		var rep Report
		req := newReq(t, "GET", "")
		req = req.WithContext(WithReport(req.Context(), &rep))
		code, _, err := roundTrip(t, tr, req)
		if code != 429 || err != nil || rep.Decision != StopRateLimited {
			t.Fatalf("got (%d, %v, %v); want the 429, rate limited", code, err, rep.Decision)
		}
		if got := budget.Available(); got != 500 {
			t.Errorf("got %d tokens; want 500 (nothing spent)", got)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

func TestCutWhileWaiting(t *testing.T) {
	// B waits for its permit when A's throttle comes back: B's permit was
	// given at the old rate, so it takes one at the new rate.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		first := rht.NewTransport(rht.Status(429))
		tr := &Transport{Base: first, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, tr, newReq(t, "GET", "")) // rate 7/s
		base := rht.NewTransport(rht.Status(429).WithDelay(50*time.Millisecond), rht.Status(200))
		tr = &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // A: sent at 1/7 s, 429 at 1/7 s + 50 ms
		synctest.Wait()
		time.Sleep(time.Millisecond)
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // B: permit at 2/7 s
		wg.Wait()
		a := base.Attempts()
		if len(a) != 2 {
			t.Fatalf("got %d attempts; want 2", len(a))
		}
		cut := seventh + 50*time.Millisecond
		lim.mu.Lock()
		next := time.Duration(float64(time.Second) / lim.rateAt(start.Add(cut)))
		lim.mu.Unlock()
		if got, want := a[1].Time.Sub(start), cut+next; got != want {
			t.Errorf("B sent after %v; want %v (one interval of the new rate after the cut), not 2/7 s", got, want)
		}
	})
}

func TestRetryPermitVoidedByACut(t *testing.T) {
	// A retry waits for its permit (1/7 s after the first 429) when another
	// request's throttle cuts the rate again at 50 ms: its permit is void,
	// and the new one (one interval of the new rate after the second cut)
	// is past its 200 ms deadline. It ends with ErrRateLimited when it
	// wakes, and its tokens go back.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		base := rht.NewTransport(rht.Status(429), rht.Status(200))
		budget := NewBudget(500)
		tr := &Transport{Base: base, Limiter: lim, Budget: budget, Policy: Policy{Rand: lowRand, Timeout: 200 * time.Millisecond}}
		time.AfterFunc(50*time.Millisecond, func() { lim.throttled(1, time.Now()) })
		start := time.Now()
		resp, err := tr.RoundTrip(newReq(t, "GET", ""))
		var re *Error
		if resp != nil || !errors.As(err, &re) || re.Decision != StopRateLimited || re.Attempts != 1 || !errors.Is(err, ErrRateLimited) {
			t.Fatalf("got (%v, %v); want a rate-limited *Error after 1 attempt", resp, err)
		}
		if took := time.Since(start); took != seventh {
			t.Errorf("returned after %v; want %v, when the voided permit was due", took, seventh)
		}
		if got := budget.Available(); got != 500 {
			t.Errorf("got %d tokens; want 500 (the retry never sent gives its 5 back)", got)
		}
		if st := lim.Stats(); st.Cuts != 2 || st.Refused != 1 {
			t.Errorf("got %+v; want 2 cuts, 1 refused", st)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

func TestSharedLimiter(t *testing.T) {
	// Two Transports share a limiter: a throttle seen by one slows the
	// other.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		one := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		other := rht.NewTransport(rht.Status(200))
		two := &Transport{Base: other, Limiter: lim}
		roundTrip(t, one, newReq(t, "GET", ""))
		start := time.Now()
		roundTrip(t, two, newReq(t, "GET", ""))
		if got, want := other.Attempts()[0].Time.Sub(start), seventh; got != want {
			t.Errorf("the other Transport sent after %v; want %v", got, want)
		}
	})
}

func TestLimiterCanceledWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base, _ := throttledOnce(0)
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, tr, newReq(t, "GET", ""))
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
		_, err := tr.RoundTrip(req)
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopCanceled || re.Attempts != 0 || !errors.Is(err, context.Canceled) {
			t.Errorf("got %v; want canceled after 0 attempts", err)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

func TestLimiterLogs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		base := rht.NewTransport(rht.Status(429), rht.Status(429), rht.Status(200))
		tr := &Transport{Base: base, Limiter: &RateLimiter{}, Policy: Policy{Rand: lowRand},
			Logger: slog.New(slog.NewTextHandler(&buf, nil))}
		roundTrip(t, tr, newReq(t, "GET", ""))
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		if len(lines) != 3 || !strings.Contains(lines[0], "rate_limit=7 ") || strings.Contains(lines[0], "permit_wait") ||
			!strings.Contains(lines[1], "permit_wait=142.857142ms") {
			t.Errorf("got log\n%s\nwant 3 lines, the first with rate_limit=7, the second with the permit wait", buf.String())
		}
	})
}

func TestLimiterUnderConcurrency(t *testing.T) {
	// 100 goroutines at once through a limiter held at 7/s: the sends
	// follow the rate, and every request either gets a permit within its
	// 1 s deadline or fails at once.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		roundTrip(t, &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}, newReq(t, "GET", ""))
		base := rht.NewTransport(rht.Status(200).Times(100))
		tr := &Transport{Base: base, Limiter: lim}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			limited int
		)
		start := time.Now()
		for range 100 {
			wg.Go(func() {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					if !errors.Is(err, ErrRateLimited) || time.Since(start) != 0 {
						t.Errorf("got %v after %v; want ErrRateLimited at once", err, time.Since(start))
					}
					mu.Lock()
					limited++
					mu.Unlock()
					return
				}
				resp.Body.Close()
			})
		}
		wg.Wait()
		sent := len(base.Attempts())
		// Permits at 1/7 s, 2/7 s, ... before 1 s: 6 or 7 (the rate
		// grows by a hair).
		if sent < 6 || sent > 7 || sent+limited != 100 {
			t.Errorf("got %d sent and %d rate limited; want 6 or 7 sent, the rest limited", sent, limited)
		}
	})
}

// reserveAt takes a permit for an attempt due at now, without waiting for
// it, and reports when it may be sent and under which epoch.
func reserveAt(l *RateLimiter, now, deadline time.Time) (time.Time, uint64, bool) {
	if !l.limiting.Load() {
		l.countIdle(now)
		return now, 0, true
	}
	p, at, ok := l.reserve(now, now, deadline)
	return at, p.epoch, ok
}

func TestRateLimiterFirstCutUsesTheRecentRate(t *testing.T) {
	// One request, an hour idle, then 100 at 20/s and a 429: the cut is
	// from the rate just measured (38 sends in the 1.85 s since the last
	// mark, at the 64th of the 100), not from the hour's average.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		ok := &Transport{Base: rht.NewTransport(rht.Status(200)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, ok, newReq(t, "GET", ""))
		time.Sleep(time.Hour)
		for range 100 {
			roundTrip(t, ok, newReq(t, "GET", ""))
			time.Sleep(50 * time.Millisecond)
		}
		throttled := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, throttled, newReq(t, "GET", ""))
		if got, want := lim.Rate(), DefaultLimiterBeta*38/1.85; !near(got, want) {
			t.Errorf("got %.3f permits/s after the cut; want %.3f (0.7 of the recent 20.5/s)", got, want)
		}
	})
}

func TestRateLimiterNonFiniteSettings(t *testing.T) {
	// NaN and infinite settings mean the defaults: the same rate after the
	// same throttle as the zero RateLimiter.
	nan, inf := math.NaN(), math.Inf(1)
	for _, l := range []*RateLimiter{
		{Beta: nan}, {Beta: inf}, {Beta: -inf}, {MinRate: nan}, {MinRate: inf}, {MinRate: -inf}, {Beta: nan, MinRate: nan},
	} {
		t.Run(fmt.Sprintf("Beta %v MinRate %v", l.Beta, l.MinRate), func(t *testing.T) {
			if l.beta() != DefaultLimiterBeta || l.minRate() != DefaultLimiterMinRate {
				t.Errorf("got beta %v, min rate %v; want the defaults", l.beta(), l.minRate())
			}
			var zero RateLimiter
			for _, lim := range []*RateLimiter{l, &zero} {
				sendSteadily(t, lim, t0, 10, 100*time.Millisecond)
				lim.throttled(0, t0.Add(time.Second))
			}
			l.mu.Lock()
			got := l.rateAt(t0.Add(2 * time.Second))
			l.mu.Unlock()
			zero.mu.Lock()
			want := zero.rateAt(t0.Add(2 * time.Second))
			zero.mu.Unlock()
			if math.IsNaN(got) || !near(got, want) {
				t.Errorf("got rate %v; want %v, the zero RateLimiter's", got, want)
			}
		})
	}
}

func TestMaxWaitBoundsTheWholeWait(t *testing.T) {
	// B is due at 1 ms with a permit at about 2/7 s, within MaxWait
	// (300 ms). A's 429 cuts the rate at 1/7 s + 50 ms, which voids B's
	// permit; the next one would come at 393 ms, 392 ms after B was due: B
	// fails at once when it finds out, rather than wait past MaxWait.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{MaxWait: 300 * time.Millisecond}
		tr := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, tr, newReq(t, "GET", "")) // rate 7/s
		base := rht.NewTransport(rht.Status(429).WithDelay(50*time.Millisecond), rht.Status(200))
		tr = &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // A
		synctest.Wait()
		time.Sleep(time.Millisecond)
		var err error
		var took time.Duration
		wg.Go(func() { // B
			_, _, err = roundTrip(t, tr, newReq(t, "GET", ""))
			took = time.Since(start)
		})
		wg.Wait()
		var re *Error
		if !errors.As(err, &re) || re.Decision != StopRateLimited || re.Attempts != 0 {
			t.Fatalf("B: got %v; want StopRateLimited after 0 attempts", err)
		}
		cut := seventh + 50*time.Millisecond
		if took <= cut || took > time.Millisecond+lim.MaxWait {
			t.Errorf("B gave up after %v; want after the cut (%v), when its voided permit was due, within MaxWait of being due", took, cut)
		}
		rht.AssertAttempts(t, base, 1)
	})
}

func TestCanceledWaiterGivesItsSlotBack(t *testing.T) {
	// A waits for the permit at 1/7 s and is canceled at 10 ms: its slot goes
	// back, and C, due at 20 ms, takes it, not the one after.
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		tr := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, tr, newReq(t, "GET", "")) // rate 7/s
		start := time.Now()
		base := rht.NewTransport(rht.Status(200))
		tr = &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		ctx, cancel := context.WithCancel(context.Background())
		time.AfterFunc(10*time.Millisecond, cancel)
		if _, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx)); !errors.Is(err, context.Canceled) {
			t.Fatalf("A: got %v; want canceled", err)
		}
		time.Sleep(10 * time.Millisecond)
		roundTrip(t, tr, newReq(t, "GET", "")) // C
		if got := base.Attempts()[0].Time.Sub(start); got != seventh {
			t.Errorf("C sent after %v; want %v (A's slot)", got, seventh)
		}
	})
}

// A waits for the first slot and B for the second; A is canceled; C comes
// next. A's slot has a later permit behind it (B's), so it is not given back:
// C is sent about one interval after B, not with it. x/time/rate's
// Reservation.Cancel, the model, restores only what later reservations have
// not taken.
func TestCanceledWaiterNeverDoubleBooksASlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim := &RateLimiter{}
		warm := &Transport{Base: rht.NewTransport(rht.Status(429)), Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		roundTrip(t, warm, newReq(t, "GET", "")) // limiting at 7/s
		base := rht.NewTransport(rht.Status(200))
		tr := &Transport{Base: base, Limiter: lim, Policy: Policy{MaxAttempts: 1}}
		start := time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx)) }) // A: slot 1
		synctest.Wait()
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // B: slot 2
		synctest.Wait()
		time.Sleep(10 * time.Millisecond)
		cancel() // A gives up
		synctest.Wait()
		wg.Go(func() { roundTrip(t, tr, newReq(t, "GET", "")) }) // C
		wg.Wait()
		a := base.Attempts()
		if len(a) != 2 {
			t.Fatalf("got %d attempts; want 2 (B and C)", len(a))
		}
		b, c := a[0].Time.Sub(start), a[1].Time.Sub(start)
		// One interval of the rate at B's slot: a little under 1/7 s, as
		// the rate grows back along its curve.
		if c-b < seventh*9/10 {
			t.Errorf("B sent at %v, C at %v: %v apart; want about one interval (%v) apart, no burst", b, c, c-b, seventh)
		}
	})
}
