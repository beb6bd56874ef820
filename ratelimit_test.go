package retryhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp"
)

// The RateLimiter through its exported API only: a Transport over a
// scripted server, in fake time, and RateLimiter.Stats.

// server is a base RoundTripper whose answers a test scripts: answer decides
// each attempt's status (and headers) from its number, counted from 1. It
// records when each attempt came.
type server struct {
	mu     sync.Mutex
	answer func(n int, at time.Time) (int, http.Header)
	sent   []time.Time
}

func (s *server) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	now := time.Now()
	s.sent = append(s.sent, now)
	n := len(s.sent)
	s.mu.Unlock()
	code, h := http.StatusOK, http.Header{}
	if s.answer != nil {
		code, h = s.answer(n, now)
	}
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: h,
		Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

// times reports when each attempt reached the server.
func (s *server) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.sent...)
}

// throttleFirst is a server that answers its first attempt 429, and 200
// after.
func throttleFirst() *server {
	return &server{answer: func(n int, _ time.Time) (int, http.Header) {
		if n == 1 {
			return http.StatusTooManyRequests, nil
		}
		return http.StatusOK, nil
	}}
}

// get sends one GET through tr with ctx and reports its status, or its
// error.
func get(tr http.RoundTripper, ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
	if err != nil {
		return 0, err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// getWithin is get with a deadline d from now.
func getWithin(tr http.RoundTripper, d time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return get(tr, ctx)
}

// limited returns a Transport with one attempt a request over srv, and its
// limiter after one throttle.
func limited(t *testing.T, srv *server) (*retryhttp.Transport, *retryhttp.RateLimiter) {
	t.Helper()
	lim := &retryhttp.RateLimiter{}
	tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
	if code, err := get(tr, context.Background()); code != http.StatusTooManyRequests {
		t.Fatalf("got (%d, %v); want the 429", code, err)
	}
	if r := lim.Stats().Rate; r <= 0 {
		t.Fatalf("got a rate of %v after a 429; want a limit", r)
	}
	return tr, lim
}

// Refused callers do not refuse the next: a caller the limiter refuses
// sends nothing, and neither shortens the queue a later caller may wait in
// nor moves its permit. 30 callers whose 10 ms deadlines their permits would
// miss are refused; a lone caller with a 5 s deadline (its share of it,
// 500 ms, is past its permit, 400 ms away) then gets the permit it would
// have got without them.
func TestRefusedCallersDoNotRefuseTheNext(t *testing.T) {
	sentAfter := func(t *testing.T, refused int) time.Duration {
		var got time.Duration
		synctest.Test(t, func(t *testing.T) {
			srv := throttleFirst()
			tr, lim := limited(t, srv)
			start := time.Now()
			for range refused {
				if _, err := getWithin(tr, 10*time.Millisecond); !errors.Is(err, retryhttp.ErrRateLimited) {
					t.Fatalf("a caller with a 10 ms deadline: got %v; want ErrRateLimited", err)
				}
			}
			if got := lim.Stats().Refused; got != int64(refused) {
				t.Errorf("got %d refused; want %d", got, refused)
			}
			if code, err := getWithin(tr, 5*time.Second); code != http.StatusOK {
				t.Fatalf("the lone caller with a 5 s deadline: got (%d, %v); want 200", code, err)
			}
			sent := srv.times()
			got = sent[len(sent)-1].Sub(start)
		})
		return got
	}
	want := sentAfter(t, 0)
	if got := sentAfter(t, 30); got != want {
		t.Errorf("after 30 refused callers, the lone caller was sent after %v; want %v, as without them", got, want)
	}
}

// A waiter whose context ends gives its slot back, in whatever order the
// waiters give up: six callers queue for permits and all cancel; the next
// caller is sent when the first of them would have been.
func TestCanceledWaitersGiveBackTheirSlots(t *testing.T) {
	orders := []struct {
		name  string
		order []int
	}{
		{"newest first", []int{5, 4, 3, 2, 1, 0}},
		{"oldest first", []int{0, 1, 2, 3, 4, 5}},
		{"interleaved", []int{0, 2, 4, 1, 3, 5}},
		{"middle out", []int{2, 3, 1, 4, 0, 5}},
	}
	for _, o := range orders {
		t.Run(o.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := throttleFirst()
				tr, lim := limited(t, srv)
				start := time.Now()
				first := time.Duration(float64(time.Second) / lim.Stats().Rate)
				var cancels []context.CancelFunc
				var wg sync.WaitGroup
				for range 6 {
					ctx, cancel := context.WithCancel(context.Background())
					cancels = append(cancels, cancel)
					wg.Go(func() {
						if _, err := get(tr, ctx); !errors.Is(err, context.Canceled) {
							t.Errorf("a canceled waiter: got %v; want context.Canceled", err)
						}
					})
					synctest.Wait() // queued in this order
				}
				for _, i := range o.order {
					cancels[i]()
					synctest.Wait()
				}
				wg.Wait()
				if code, err := getWithin(tr, 10*time.Second); code != http.StatusOK {
					t.Fatalf("got (%d, %v); want 200", code, err)
				}
				sent := srv.times()
				if len(sent) != 2 {
					t.Fatalf("got %d attempts; want 2 (the 429, then the last caller's)", len(sent))
				}
				if got := sent[1].Sub(start); got > first {
					t.Errorf("the caller after six canceled waiters was sent after %v; want at most %v, the first waiter's slot", got, first)
				}
			})
		})
	}
}

// The model, sentence by sentence (RateLimiter's doc), in fake time.

// statsOf is lim's state, rate and cuts, for messages.
func statsOf(lim *retryhttp.RateLimiter) string {
	s := lim.Stats()
	return fmt.Sprintf("%s at %v/s after %d cuts", s.State, s.Rate, s.Cuts)
}

func near(got, want float64) bool { return math.Abs(got-want) <= 1e-9*math.Abs(want) }

// Until its first throttle a limiter is free: 50 requests at once all go at
// once.
func TestFreeUntilTheFirstThrottle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{}
		lim := &retryhttp.RateLimiter{}
		tr := &retryhttp.Transport{Base: srv, Limiter: lim}
		start := time.Now()
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() { get(tr, context.Background()) })
		}
		wg.Wait()
		for i, at := range srv.times() {
			if at != start {
				t.Fatalf("attempt %d sent after %v; want at once", i, at.Sub(start))
			}
		}
		if s := lim.Stats(); s != (retryhttp.RateLimiterStats{State: "free"}) {
			t.Errorf("got %+v; want free, no rate, no cut", s)
		}
	})
}

// The first cut keeps limBeta squared (a quarter) of the rate sent: one
// send, metered over the meters' shortest span (a tenth of a second), is
// 10/s, cut to 2.5/s. Twice the sends, twice the rate.
func TestFirstCutKeepsAQuarterOfTheRateSent(t *testing.T) {
	for _, sends := range []int{1, 2, 10} {
		t.Run(fmt.Sprint(sends), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := &server{answer: func(n int, _ time.Time) (int, http.Header) {
					if n == sends {
						return http.StatusTooManyRequests, nil
					}
					return http.StatusOK, nil
				}}
				lim := &retryhttp.RateLimiter{}
				tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
				for range sends {
					get(tr, context.Background())
				}
				s := lim.Stats()
				if want := 0.25 * 10 * float64(sends); s.State != "recovering" || s.Cuts != 1 || !near(s.Rate, want) {
					t.Errorf("got %s; want recovering at %v/s after 1 cut", statsOf(lim), want)
				}
			})
		})
	}
}

// One cut a round: three attempts sent before the first throttle, all
// throttled, cut once.
func TestOneCutARound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{answer: func(int, time.Time) (int, http.Header) {
			time.Sleep(10 * time.Millisecond)
			return http.StatusTooManyRequests, nil
		}}
		lim := &retryhttp.RateLimiter{}
		tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
		var wg sync.WaitGroup
		for range 3 {
			wg.Go(func() { get(tr, context.Background()) })
		}
		wg.Wait()
		if got := lim.Stats().Cuts; got != 1 {
			t.Errorf("got %d cuts for 3 throttles of one round; want 1", got)
		}
	})
}

// A later cut keeps the share of its round's answers that were accepted,
// less a tenth (limMargin), and at least half (limBeta): 9 accepted before
// the throttle (9 of 10) keep 0.81 of the rate, 1 (1 of 2) half, none half.
// A round with half accepted or more holds the new rate (it is the same
// 100 ms later); a worse one grows back at once.
func TestLaterCutKeepsTheAcceptedShare(t *testing.T) {
	for _, tc := range []struct {
		accepted int
		keep     float64
		held     bool
	}{{9, 0.9 * 0.9, true}, {1, 0.5, true}, {0, 0.5, false}} {
		t.Run(fmt.Sprint(tc.accepted), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim := &retryhttp.RateLimiter{}
				var before float64
				srv := &server{answer: func(n int, _ time.Time) (int, http.Header) {
					switch {
					case n <= 100: // free: 1,000/s sent
						return http.StatusOK, nil
					case n == 101: // the first cut
						return http.StatusTooManyRequests, nil
					case n <= 101+tc.accepted:
						return http.StatusOK, nil
					}
					before = lim.Stats().Rate // the rate that draws the throttle
					return http.StatusTooManyRequests, nil
				}}
				tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
				var wg sync.WaitGroup
				for range 100 {
					wg.Go(func() { get(tr, context.Background()) })
				}
				wg.Wait()
				for range 1 + tc.accepted + 1 {
					get(tr, context.Background())
				}
				after := lim.Stats()
				if want := tc.keep * before; after.Cuts != 2 || !near(after.Rate, want) {
					t.Fatalf("got %s; want %v/s (%v of %v/s) after 2 cuts", statsOf(lim), want, tc.keep, before)
				}
				time.Sleep(100 * time.Millisecond)
				if got := lim.Stats().Rate; (got == after.Rate) != tc.held || got < after.Rate {
					t.Errorf("100 ms after the cut: got %v/s, from %v/s; want it held: %v, and never lower", got, after.Rate, tc.held)
				}
			})
		})
	}
}

// After the cut the rate grows along a cubic: concave (each 100 ms adds
// less than the last) while recovering, convex (more) once probing.
func TestRateGrowsAlongACubic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := throttleFirst()
		tr, lim := limited(t, srv)
		// Asks that keep the demand up, none of which is sent: each
		// deadline is too close for a permit.
		stop := make(chan struct{})
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Millisecond):
					getWithin(tr, time.Millisecond)
				}
			}
		}()
		var rates []float64
		var states []string
		for range 60 {
			time.Sleep(100 * time.Millisecond)
			s := lim.Stats()
			rates, states = append(rates, s.Rate), append(states, s.State)
		}
		close(stop)
		sawProbing := false
		for i := 2; i < len(rates); i++ {
			d1, d2 := rates[i-1]-rates[i-2], rates[i]-rates[i-1]
			if d2 <= 0 && rates[i] < 2*rates[0] {
				t.Fatalf("at %d00 ms: the rate went from %v to %v/s; want it growing", i+1, rates[i-1], rates[i])
			}
			switch states[i] {
			case "recovering":
				if sawProbing || d2 > d1 {
					t.Errorf("at %d00 ms, recovering: steps %v then %v (probing seen before: %v); want shrinking steps", i+1, d1, d2, sawProbing)
				}
			case "probing":
				if states[i-2] == "probing" && d2 < d1 && rates[i] < lim.Stats().Rate {
					t.Errorf("at %d00 ms, probing: steps %v then %v; want growing steps", i+1, d1, d2)
				}
				sawProbing = true
			default:
				t.Fatalf("at %d00 ms: got state %q", i+1, states[i])
			}
		}
		if !sawProbing {
			t.Errorf("got states %q; want probing within 6 s", states)
		}
	})
}

// The cubic's scale is a share of the demand: a client that sent twice as
// much before the same throttle has twice the rate, all along.
func TestGrowthFollowsTheDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lims := make([]*retryhttp.RateLimiter, 2)
		for i := range lims {
			sends := i + 1
			srv := &server{answer: func(n int, _ time.Time) (int, http.Header) {
				if n == sends {
					return http.StatusTooManyRequests, nil
				}
				return http.StatusOK, nil
			}}
			lims[i] = &retryhttp.RateLimiter{}
			tr := &retryhttp.Transport{Base: srv, Limiter: lims[i], Policy: retryhttp.Policy{MaxAttempts: 1}}
			for range sends {
				get(tr, context.Background())
			}
		}
		for range 50 {
			if one, two := lims[0].Stats().Rate, lims[1].Stats().Rate; !near(two, 2*one) {
				t.Fatalf("got %v/s and %v/s; want twice the rate for twice the demand", one, two)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// The rate is never less than one permit per limTau (a second), however
// many throttles.
func TestRateBounds(t *testing.T) {
	t.Run("at least one a second", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			srv := &server{answer: func(int, time.Time) (int, http.Header) { return http.StatusTooManyRequests, nil }}
			lim := &retryhttp.RateLimiter{}
			tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
			for range 30 {
				get(tr, context.Background())
			}
			if s := lim.Stats(); s.Rate != 1 || s.Cuts != 30 {
				t.Errorf("got %s after 30 rounds of throttles; want 1/s after 30 cuts", statsOf(lim))
			}
		})
	})
}

// Permits are one interval of the rate apart, and a slot left unused for
// an interval is kept: after an idle second, two requests go at once and the
// third waits one interval.
func TestPermitsKeepAnUnusedSlot(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := throttleFirst()
		tr, lim := limited(t, srv)
		time.Sleep(time.Second)
		start := time.Now()
		var wg sync.WaitGroup
		var rate float64 // when the second permit is given, which spaces the third
		for i := range 3 {
			wg.Go(func() { get(tr, context.Background()) })
			synctest.Wait()
			if i == 1 {
				rate = lim.Stats().Rate
			}
		}
		wg.Wait()
		sent := srv.times()[1:]
		iv := time.Duration(float64(time.Second) / rate)
		if sent[0] != start || sent[1] != start || sent[2].Sub(start) != iv {
			t.Errorf("sent after %v, %v and %v; want 0, 0 and %v (one interval at %v/s)",
				sent[0].Sub(start), sent[1].Sub(start), sent[2].Sub(start), iv, rate)
		}
	})
}

// A cut starts a new schedule: a request waiting for its permit when a
// throttle cuts the rate asks again, and goes one interval of the new rate
// after the cut, not at its old slot.
func TestCutStartsANewSchedule(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{answer: func(n int, _ time.Time) (int, http.Header) {
			switch n {
			case 1:
				return http.StatusTooManyRequests, nil // the first cut
			case 2:
				time.Sleep(50 * time.Millisecond) // answered while the third waits
				return http.StatusTooManyRequests, nil
			}
			return http.StatusOK, nil
		}}
		lim := &retryhttp.RateLimiter{}
		tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
		get(tr, context.Background())
		time.Sleep(time.Second) // a slot due now, and one an interval later
		start := time.Now()
		var wg sync.WaitGroup
		wg.Go(func() { get(tr, context.Background()) }) // sent now, throttled at 50 ms
		synctest.Wait()
		wg.Go(func() { get(tr, context.Background()) }) // sent now too: the slot kept
		synctest.Wait()
		wg.Go(func() { get(tr, context.Background()) }) // waits an interval
		synctest.Wait()
		time.Sleep(50 * time.Millisecond)
		synctest.Wait() // the throttle answered
		cut := time.Now()
		rate := lim.Stats().Rate
		wg.Wait()
		sent := srv.times()
		if got, want := sent[len(sent)-1].Sub(cut), time.Duration(float64(time.Second)/rate); lim.Stats().Cuts != 2 || got != want {
			t.Errorf("the waiting request went %v after the cut (%s); want %v, one interval at the cut's %v/s (queued at %v)",
				got, statsOf(lim), want, rate, sent[len(sent)-1].Sub(start))
		}
	})
}

// An attempt waits only within a tenth of the time left before its
// deadline, and within MaxWait: a permit 400 ms away (2.5/s) is too far for
// a 3 s deadline or a MaxWait of 300 ms, and near enough for 5 s or 500 ms.
func TestWaitWithinATenthOfTheDeadline(t *testing.T) {
	for _, tc := range []struct {
		deadline, maxWait time.Duration
		sent              bool
	}{
		{3 * time.Second, 0, false},
		{5 * time.Second, 0, true},
		{0, 300 * time.Millisecond, false},
		{0, 500 * time.Millisecond, true},
		{5 * time.Second, 300 * time.Millisecond, false},
	} {
		t.Run(fmt.Sprintf("%v,%v", tc.deadline, tc.maxWait), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := throttleFirst()
				lim := &retryhttp.RateLimiter{MaxWait: tc.maxWait}
				tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
				get(tr, context.Background())
				start := time.Now()
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if tc.deadline > 0 {
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
				}
				defer cancel()
				code, err := get(tr, ctx)
				switch {
				case tc.sent && (code != http.StatusOK || time.Since(start) != 400*time.Millisecond):
					t.Errorf("got (%d, %v) after %v; want 200 after 400ms", code, err, time.Since(start))
				case !tc.sent && (!errors.Is(err, retryhttp.ErrRateLimited) || time.Since(start) != 0 || len(srv.times()) != 1):
					t.Errorf("got (%d, %v) after %v, %d attempts; want ErrRateLimited at once, nothing sent", code, err, time.Since(start), len(srv.times()))
				}
			})
		})
	}
}

// A throttle with Retry-After after a fall (its round had nothing accepted)
// pauses the limiter: paused, it gives no permit before the time the server
// asked for, 2 s here.
func TestRetryAfterPausesAfterAFall(t *testing.T) {
	for _, header := range []string{"Retry-After", "X-Amz-Retry-After"} {
		t.Run(header, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				value := map[string]string{"Retry-After": "2", "X-Amz-Retry-After": "2000"}[header]
				srv := &server{answer: func(n int, _ time.Time) (int, http.Header) {
					if n == 1 {
						return http.StatusTooManyRequests, http.Header{header: {value}}
					}
					return http.StatusOK, nil
				}}
				lim := &retryhttp.RateLimiter{}
				tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
				get(tr, context.Background())
				start := time.Now()
				if s := lim.Stats(); s.State != "paused" {
					t.Errorf("got %s; want paused", statsOf(lim))
				}
				if code, err := get(tr, context.Background()); code != http.StatusOK || time.Since(start) != 2*time.Second {
					t.Errorf("got (%d, %v) after %v; want 200 after the 2 s asked for", code, err, time.Since(start))
				}
				if s := lim.Stats(); s.State == "paused" {
					t.Errorf("got %s after the pause; want no longer paused", statsOf(lim))
				}
			})
		})
	}
}

// A throttle with Retry-After after a round with most answers accepted holds
// the rate until the time the server asked for, 3 s here (longer than the
// hold of 2.47 s it would have had), and pauses nothing: the next request
// goes at once.
func TestRetryAfterHoldsTheRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{answer: func(n int, _ time.Time) (int, http.Header) {
			switch {
			case n <= 100 || (n > 101 && n <= 110): // free at 1,000/s; then 9 accepted
				return http.StatusOK, nil
			case n == 101: // the first cut
				return http.StatusTooManyRequests, nil
			case n == 111:
				return http.StatusTooManyRequests, http.Header{"Retry-After": {"3"}}
			}
			return http.StatusOK, nil
		}}
		lim := &retryhttp.RateLimiter{}
		tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
		var wg sync.WaitGroup
		for range 100 {
			wg.Go(func() { get(tr, context.Background()) })
		}
		wg.Wait()
		for range 11 {
			get(tr, context.Background())
		}
		start, cut := time.Now(), lim.Stats()
		if cut.Cuts != 2 || cut.State != "recovering" {
			t.Fatalf("got %s; want recovering after 2 cuts, not paused", statsOf(lim))
		}
		if code, err := get(tr, context.Background()); code != http.StatusOK || time.Since(start) > time.Second/time.Duration(cut.Rate) {
			t.Errorf("got (%d, %v) after %v; want 200 within one interval", code, err, time.Since(start))
		}
		time.Sleep(start.Add(3*time.Second - time.Millisecond).Sub(time.Now()))
		if got := lim.Stats().Rate; got != cut.Rate {
			t.Errorf("1 ms before the 3 s asked for: got %v/s; want the cut's %v/s", got, cut.Rate)
		}
		time.Sleep(101 * time.Millisecond)
		if got := lim.Stats().Rate; got <= cut.Rate {
			t.Errorf("100 ms after the 3 s: got %v/s; want more than the cut's %v/s", got, cut.Rate)
		}
	})
}

// Kept from the limiter before, through the exported API.

// A retry whose permit would come too late is not made: the 429 is returned
// as it is, and the retry's tokens go back.
func TestRetryWithoutPermitReturnsTheResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := &server{answer: func(int, time.Time) (int, http.Header) { return http.StatusTooManyRequests, nil }}
		budget := retryhttp.NewTokenBucket(500)
		tr := &retryhttp.Transport{Base: srv, Limiter: &retryhttp.RateLimiter{}, Budget: budget,
			Policy: retryhttp.Policy{Timeout: 100 * time.Millisecond}}
		if code, err := get(tr, context.Background()); code != http.StatusTooManyRequests || err != nil {
			t.Fatalf("got (%d, %v); want the 429", code, err)
		}
		if got := budget.Available(); got != 500 {
			t.Errorf("got %d tokens; want 500 (nothing spent)", got)
		}
		if n := len(srv.times()); n != 1 {
			t.Errorf("got %d attempts; want 1", n)
		}
	})
}

// Two Transports share a limiter: a throttle seen by one slows the other,
// whose first request goes one interval (400 ms at 2.5/s) after the cut.
func TestSharedLimiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, lim := limited(t, throttleFirst())
		other := &server{}
		two := &retryhttp.Transport{Base: other, Limiter: lim}
		start := time.Now()
		get(two, context.Background())
		if got := other.times()[0].Sub(start); got != 400*time.Millisecond {
			t.Errorf("the other Transport sent after %v; want 400ms", got)
		}
	})
}

// 100 goroutines at once through a limiting limiter with 1 s deadlines:
// each request is sent within a tenth of its deadline or fails at once,
// and every one is one or the other.
func TestLimiterUnderConcurrency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		srv := throttleFirst()
		lim := &retryhttp.RateLimiter{}
		tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
		get(tr, context.Background())
		time.Sleep(time.Second)
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		sent, limitedN := 0, 0
		for range 100 {
			wg.Go(func() {
				code, err := getWithin(tr, time.Second)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case code == http.StatusOK && time.Since(start) <= 100*time.Millisecond:
					sent++
				case errors.Is(err, retryhttp.ErrRateLimited) && time.Since(start) == 0:
					limitedN++
				default:
					t.Errorf("got (%d, %v) after %v; want 200 within 100ms or ErrRateLimited at once", code, err, time.Since(start))
				}
			})
		}
		wg.Wait()
		if sent == 0 || sent+limitedN != 100 || lim.Stats().Refused != int64(limitedN) {
			t.Errorf("got %d sent, %d limited, %d refused; want some sent, the rest limited and counted", sent, limitedN, lim.Stats().Refused)
		}
	})
}
