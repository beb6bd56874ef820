package retryhttp

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestHedgeShareBoundsExtraCopies(t *testing.T) {
	// 200 requests one after another, every copy slow, hedged after 10ms
	// with the default share (5%, starting empty): each request adds a
	// twentieth of a hedge, so requests 20, 40, ... 200 get one, and lose
	// (their first copy answers first). 10 hedges: 5% extra, from the first
	// request on.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(200).WithDelay(100 * time.Millisecond))
		var hedged []int
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond},
			OnAttempt: func(a Attempt) {
				if a.Hedges > 0 {
					hedged = append(hedged, len(hedged))
				}
			}}
		for range 200 {
			roundTrip(t, tr, newReq(t, "GET", ""))
		}
		if got := len(base.Attempts()); got != 210 {
			t.Errorf("got %d copies for 200 requests; want 210", got)
		}
		if len(hedged) != 10 {
			t.Errorf("got %d hedged requests; want 10", len(hedged))
		}
	})
}

func TestHedgeThatWinsGivesItsShareBack(t *testing.T) {
	// Every first copy slow and every hedge fast: once the share holds a
	// hedge (request 20), each hedge wins and gives it back, so every
	// request from the 20th on is hedged: 181 of 200.
	synctest.Test(t, func(t *testing.T) {
		tr := &Transport{Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if requestAttempt(r) == 1 {
				<-r.Context().Done() // slow: canceled when the hedge wins, or after a second
				return nil, r.Context().Err()
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
		}), Policy: Policy{HedgeDelay: 10 * time.Millisecond, SendAttemptHeader: true, Timeout: time.Second}}
		won := 0
		tr.OnAttempt = func(a Attempt) {
			if a.HedgeWon {
				won++
			}
		}
		for range 200 {
			roundTrip(t, tr, newReq(t, "GET", ""))
		}
		if won != 181 {
			t.Errorf("got %d hedges that won; want 181", won)
		}
	})
}

func TestLatencyQuantile(t *testing.T) {
	// Buckets are a quarter of a doubling wide: 1ms falls in the one up to
	// 1.12ms (1.75 x 64 x 10µs), 100ms in the one up to 102.4ms.
	tests := []struct {
		q    float64
		want time.Duration
	}{
		{0.5, 1120 * time.Microsecond},
		{0.95, 1120 * time.Microsecond},
		{0.951, 102400 * time.Microsecond},
		{0.99, 102400 * time.Microsecond},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprint(tc.q), func(t *testing.T) {
			var l latency
			for i := range latencyWindow {
				d := time.Millisecond
				if i%20 == 19 { // one in twenty
					d = 100 * time.Millisecond
				}
				l.record(d, tc.q)
			}
			if got := l.estimate(); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
	t.Run("early estimates", func(t *testing.T) {
		var l latency
		for i := range 19 {
			l.record(time.Millisecond, 0.95)
			if got := l.estimate(); got != 0 {
				t.Fatalf("after %d samples: got %v; want none yet", i+1, got)
			}
		}
		l.record(time.Millisecond, 0.95)
		if got := l.estimate(); got != 1120*time.Microsecond {
			t.Errorf("after 20 samples: got %v; want 1.12ms", got)
		}
	})
	t.Run("bucket edges", func(t *testing.T) {
		for _, d := range []time.Duration{0, time.Microsecond, 10 * time.Microsecond, 12499 * time.Nanosecond, 12500 * time.Nanosecond,
			15 * time.Microsecond, time.Millisecond, 1120 * time.Microsecond, time.Second, 100 * time.Second} {
			if b := bucket(d); d >= top(b) || (b > 0 && d < top(b-1)) {
				t.Errorf("%v: bucket %d holds [%v, %v)", d, b, top(b-1), top(b))
			}
		}
		if b := bucket(time.Hour); b != latencyBuckets-1 {
			t.Errorf("an hour: got bucket %d; want the last, %d", b, latencyBuckets-1)
		}
	})
}

func TestHedgeQuantileDelay(t *testing.T) {
	// With HedgeQuantile 0.95, no hedge until 20 attempts are measured; then
	// the delay is their 95th percentile: 1ms answers put it at 1.12ms.
	synctest.Test(t, func(t *testing.T) {
		steps := []rht.Step{rht.Status(200).WithDelay(time.Millisecond).Times(20), rht.Status(200).WithDelay(time.Second), rht.Status(200)}
		base := rht.NewTransport(steps...)
		var last Attempt
		tr := &Transport{Base: base, Policy: Policy{HedgeQuantile: 0.95, HedgeRatio: 1}, OnAttempt: func(a Attempt) { last = a }}
		for range 20 {
			roundTrip(t, tr, newReq(t, "GET", ""))
			if last.Hedges != 0 {
				t.Fatal("a hedge before 20 attempts were measured")
			}
		}
		synctest.Wait() // the copies count their latencies
		start := time.Now()
		roundTrip(t, tr, newReq(t, "GET", ""))
		if took := time.Since(start); last.Hedges != 1 || !last.HedgeWon || took != 1120*time.Microsecond {
			t.Errorf("got %d hedges (won %v) after %v; want the hedge's answer after 1.12ms", last.Hedges, last.HedgeWon, took)
		}
	})
}

func TestHedgeWinsDoNotPullTheDelayDown(t *testing.T) {
	// HedgeQuantile 0.5. Twenty 10ms answers set the delay at the top of
	// their bucket, d. Then thirty requests whose first copy would take a
	// second and whose hedge answers in 1ms: each hedge wins at d+1ms, and
	// the copy it beat counts as d+1ms (it took at least that long), not
	// the hedge's 1ms. At fifty samples the median is d+1ms's bucket, and
	// the next hedge goes out then.
	synctest.Test(t, func(t *testing.T) {
		slow, fast := rht.Status(200).WithDelay(time.Second), rht.Status(200).WithDelay(time.Millisecond)
		steps := []rht.Step{rht.Status(200).WithDelay(10 * time.Millisecond).Times(20)}
		for range 31 {
			steps = append(steps, slow.Times(1), fast.Times(1))
		}
		tr := &Transport{Base: rht.NewTransport(steps...), Policy: Policy{HedgeQuantile: 0.5, HedgeRatio: 1}}
		d := top(bucket(10 * time.Millisecond))
		for i := range 51 {
			start := time.Now()
			roundTrip(t, tr, newReq(t, "GET", ""))
			took := time.Since(start)
			synctest.Wait() // the beaten copies are drained
			want := 10 * time.Millisecond
			switch {
			case i == 50:
				want = top(bucket(d+time.Millisecond)) + time.Millisecond
			case i >= 20:
				want = d + time.Millisecond
			}
			if took != want {
				t.Fatalf("request %d: took %v; want %v", i+1, took, want)
			}
		}
	})
}

func TestOneLatencySampleAnAttempt(t *testing.T) {
	// HedgeQuantile 0.5, with a delay of 10ms's bucket known (twenty 10ms
	// answers); then one request of each shape. Only the first copy of each
	// attempt is measured, once, and never once the caller has canceled.
	d := top(bucket(10 * time.Millisecond)) // the hedge delay
	tests := []struct {
		name   string
		base   func(calls *atomic.Int32) http.RoundTripper
		cancel time.Duration // the caller cancels then; 0: never
		max    int
		want   int64         // samples added
		in     time.Duration // a sample in this latency's bucket; 0: none checked
	}{
		{"the first copy wins after the hedge went out", func(calls *atomic.Int32) http.RoundTripper {
			return delays(calls, d+time.Millisecond, time.Hour)
		}, 0, 3, 1, d + time.Millisecond},
		{"the hedge wins, the first copy answers later", func(calls *atomic.Int32) http.RoundTripper {
			return delays(calls, time.Second, time.Millisecond)
		}, 0, 3, 1, d + time.Millisecond},
		{"the hedge wins, the first copy ignores cancellation", func(calls *atomic.Int32) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if calls.Add(1) == 1 {
					time.Sleep(time.Second)
				} else {
					time.Sleep(time.Millisecond)
				}
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
			})
		}, 0, 3, 1, d + time.Millisecond},
		{"the first copy fails, then the hedge wins", func(calls *atomic.Int32) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if calls.Add(1) == 1 {
					time.Sleep(d + 2*time.Millisecond)
					return &http.Response{StatusCode: 503, Body: http.NoBody, Request: r}, nil
				}
				time.Sleep(5 * time.Millisecond)
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
			})
		}, 0, 3, 1, d + 2*time.Millisecond},
		{"both copies fail, the hedge last: then a lone last attempt", func(calls *atomic.Int32) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				n := calls.Add(1)
				switch n {
				case 1:
					time.Sleep(d + 2*time.Millisecond)
				case 2:
					time.Sleep(5 * time.Millisecond)
				default:
					time.Sleep(3 * time.Millisecond)
					return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
				}
				return &http.Response{StatusCode: 503, Body: http.NoBody, Request: r}, nil
			})
		}, 0, 3, 2, 3 * time.Millisecond},
		{"the caller cancels while both copies run", func(calls *atomic.Int32) http.RoundTripper {
			return delays(calls, time.Second, time.Second)
		}, d + time.Millisecond, 3, 0, 0},
		{"the caller cancels while both copies run, bases ignore it", func(calls *atomic.Int32) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				calls.Add(1)
				time.Sleep(time.Second)
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
			})
		}, d + time.Millisecond, 3, 0, 0},
		{"the caller cancels before the hedge, the base ignores it", func(calls *atomic.Int32) http.RoundTripper {
			return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				calls.Add(1)
				time.Sleep(time.Second)
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
			})
		}, time.Millisecond, 3, 0, 0},
		{"a lone attempt (MaxAttempts 1 is never hedged, never measured)", func(calls *atomic.Int32) http.RoundTripper {
			return delays(calls, time.Millisecond)
		}, 0, 1, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var calls atomic.Int32
				warm := delays(&calls, 10*time.Millisecond)
				var real atomic.Pointer[http.RoundTripper]
				real.Store(&warm)
				tr := &Transport{Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) { return (*real.Load()).RoundTrip(r) }),
					Policy: Policy{HedgeQuantile: 0.5, HedgeRatio: 1, Rand: lowRand}}
				for range 20 {
					if _, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil {
						t.Fatal(err)
					}
				}
				synctest.Wait()
				if got := tr.hedges.p.Load().lat.estimate(); got != d {
					t.Fatalf("estimate %v; want %v", got, d)
				}
				calls.Store(0)
				b := tc.base(&calls)
				real.Store(&b)
				before := samples(tr)
				var inBefore int64
				if tc.in > 0 {
					inBefore = bucketOf(tr, tc.in)
				}
				tr.Policy.MaxAttempts = tc.max
				ctx, cancel := context.WithCancel(context.Background())
				if tc.cancel > 0 {
					time.AfterFunc(tc.cancel, cancel)
				}
				roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
				time.Sleep(2 * time.Hour) // every copy answers
				synctest.Wait()
				cancel()
				if got := samples(tr) - before; got != tc.want {
					t.Errorf("got %d samples; want %d", got, tc.want)
				}
				if tc.in > 0 && bucketOf(tr, tc.in)-inBefore < 1 {
					t.Errorf("no sample in %v's bucket", tc.in)
				}
			})
		})
	}
}

func samples(tr *Transport) int64 {
	hs := tr.hedges.p.Load()
	if hs == nil {
		return 0
	}
	var n int64
	for g := range hs.lat.counts {
		for b := range hs.lat.counts[g] {
			n += int64(hs.lat.counts[g][b].Load())
		}
	}
	if n != hs.lat.n.Load() && !hs.lat.turned.Load() {
		panic(fmt.Sprintf("counts %d, n %d", n, hs.lat.n.Load()))
	}
	return n
}

func bucketOf(tr *Transport, d time.Duration) int64 {
	hs := tr.hedges.p.Load()
	b := bucket(d)
	return int64(hs.lat.counts[0][b].Load() + hs.lat.counts[1][b].Load())
}

func delays(calls *atomic.Int32, ds ...time.Duration) http.RoundTripper {
	return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		n := int(calls.Add(1))
		d := ds[min(n, len(ds))-1]
		select {
		case <-time.After(d):
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	})
}

func rep(d time.Duration, n int) []time.Duration {
	s := make([]time.Duration, n)
	for i := range s {
		s[i] = d
	}
	return s
}

// A HedgeRatio of 0.0004 (a hedge in 2,500 requests) adds its share: with
// thousandths of a hedge it rounded to none, and no hedge was ever sent.
func TestSmallHedgeRatioHedges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			select {
			case <-time.After(5 * time.Millisecond):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
		})
		hedges := 0
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: time.Millisecond, HedgeRatio: 0.0004},
			OnAttempt: func(a Attempt) { hedges += a.Hedges }}
		for range 5000 { // two hedges' worth of share
			if _, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil {
				t.Fatal(err)
			}
		}
		if hedges < 1 || hedges > 2 {
			t.Errorf("got %d hedges in 5000 requests, every one slower than HedgeDelay, with HedgeRatio 0.0004; want 1 or 2", hedges)
		}
	})
}

// A tiny HedgeRatio is its share: at 1e-9, 2,000,001 requests do not pay
// for a hedge. With a floor of a millionth of a hedge a request, they did.
func TestTinyHedgeRatio(t *testing.T) {
	p := &Policy{HedgeRatio: 1e-9}
	ratio := p.hedgeRatio()
	var q hedgeQuota
	const requests = 2_000_001
	for range requests {
		q.deposit(ratio)
	}
	keep := int64((1-ratio)*hedgeUnit + 0.5)
	if q.take(keep) {
		t.Errorf("HedgeRatio %v: %d requests paid for a hedge (%.0fx the share); want none before %.0f requests",
			ratio, requests, 1/(ratio*requests), 1/ratio)
	}
}

// Hedge quota edges: HedgeRatio 1 adds a whole hedge a request and keeps
// none back; 10 fills the quota (10 hedges) in one request; above 10 and
// +Inf/NaN/negative are 10 and the default.
func TestHedgeQuotaEdges(t *testing.T) {
	for _, tc := range []struct {
		ratio float64
		want  float64
	}{{1, 1}, {10, 10}, {11, 10}, {math.Inf(1), defaultHedgeRatio}, {math.NaN(), defaultHedgeRatio}, {-1, defaultHedgeRatio}, {1e-300, 1e-300}} {
		if got := (&Policy{HedgeRatio: tc.ratio}).hedgeRatio(); got != tc.want {
			t.Errorf("HedgeRatio %v: got %v; want %v", tc.ratio, got, tc.want)
		}
	}
	var q hedgeQuota
	q.deposit(10)
	n := 0
	for q.take(0) {
		n++
	}
	if n != hedgeBurst {
		t.Errorf("ratio 10: one request gave %d hedges; want %d", n, hedgeBurst)
	}
	var one hedgeQuota
	one.deposit(1)
	if !one.take(0) || one.take(0) {
		t.Error("ratio 1: want exactly one hedge a request")
	}
}

func TestHedgeShareCappedAfterWinningHedges(t *testing.T) {
	// A hedge that wins gives its share back, but never past the cap
	// (hedgeBurst, 10 hedges). 100 workers make 20 requests each, one
	// first copy in ten slow and its hedge fast, so hedges win while the
	// other requests fill the share. 200 fast requests then leave it full.
	// In the all-slow spell that follows, 100 requests one after another
	// find the 10 stored (the first one's share is lost: the share is full)
	// and add 99 twentieths: 14 hedges, all of which lose.
	synctest.Test(t, func(t *testing.T) {
		var allSlow atomic.Bool
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			d := time.Millisecond
			if allSlow.Load() || (r.Header.Get("X-Slow") != "" && requestAttempt(r) == 1) {
				d = 100 * time.Millisecond
			}
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
		})
		var won, lost atomic.Int32
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, SendAttemptHeader: true},
			OnAttempt: func(a Attempt) {
				switch {
				case a.HedgeWon:
					won.Add(1)
				case a.Hedges > 0:
					lost.Add(int32(a.Hedges))
				}
			}}
		send := func(slow bool) {
			req := newReq(t, "GET", "")
			if slow {
				req.Header.Set("X-Slow", "1")
			}
			roundTrip(t, tr, req)
		}
		var wg sync.WaitGroup
		for w := range 100 {
			wg.Go(func() {
				for i := range 20 {
					send((w+i)%10 == 0)
				}
			})
		}
		wg.Wait()
		for range 200 {
			send(false)
		}
		if won.Load() == 0 {
			t.Fatalf("got no hedge that won in the first spell; want some")
		}
		won.Store(0)
		lost.Store(0)
		allSlow.Store(true)
		for range 100 {
			send(false)
		}
		const burst = 10 // Policy.HedgeRatio: the share holds at most 10 hedges
		if got := lost.Load(); got != burst+4 || won.Load() != 0 {
			t.Errorf("got %d hedges that lost (%d won) in 100 slow requests; want %d, the %d the share holds at most and 4 of the 4.95 the other 99 add", got, won.Load(), burst+4, burst)
		}
	})
}
