package retryhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// The measured timeout in these tests: 1000 attempts of 10ms set it at
// 15.36ms, and each censorAlarm counted cuts double it.
const (
	cutAt    = 15360 * time.Microsecond
	raisedAt = 2 * cutAt
)

// hangs blocks until r's context ends.
func hangs(r *http.Request) (*http.Response, error) {
	<-r.Context().Done()
	return nil, r.Context().Err()
}

// answersAfter returns a base answering 200 after d, with body, or failing
// when r's context ends first.
func answersAfter(d time.Duration, body func(*http.Request) io.ReadCloser) func(*http.Request) (*http.Response, error) {
	return func(r *http.Request) (*http.Response, error) {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			b := io.ReadCloser(http.NoBody)
			if body != nil {
				b = body(r)
			}
			return &http.Response{StatusCode: 200, Header: http.Header{}, Body: b, Request: r}, nil
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
	}
}

// delayedBody is a body whose bytes come after its delay, or that fails once
// its request's context ends.
type delayedBody struct {
	ctx   context.Context
	delay time.Duration
	done  bool
}

func (b *delayedBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	timer := time.NewTimer(b.delay)
	defer timer.Stop()
	select {
	case <-timer.C:
		b.done = true
		return copy(p, "ok"), nil
	case <-b.ctx.Done():
		return 0, b.ctx.Err()
	}
}

func (b *delayedBody) Close() error { return nil }

// switchBase sends each request to the base it holds at the time.
type switchBase struct {
	mu sync.Mutex
	f  func(*http.Request) (*http.Response, error)
}

func (b *switchBase) set(f func(*http.Request) (*http.Response, error)) {
	b.mu.Lock()
	b.f = f
	b.mu.Unlock()
}

func (b *switchBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.mu.Lock()
	f := b.f
	b.mu.Unlock()
	return f(r)
}

// once sends one request under ov (MaxAttempts 1 unless it says), and
// returns its error.
func once(t *testing.T, tr *Transport, ctx context.Context, ov Override) error {
	t.Helper()
	if ov.MaxAttempts == 0 {
		ov.MaxAttempts = 1
	}
	resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(WithOverride(ctx, ov)))
	if err == nil {
		resp.Body.Close()
	}
	return err
}

// measuredAt15ms returns a Transport whose measured timeout is cutAt, and
// its base, now answering after 10ms.
func measuredAt15ms(t *testing.T, p Policy, ph *PerHost) (*Transport, *switchBase) {
	t.Helper()
	b := &switchBase{f: answersAfter(10*time.Millisecond, nil)}
	p.AttemptTimeout, p.AttemptTimeoutQuantile = time.Second, 0.999
	tr := &Transport{Base: b, Policy: p, PerHost: ph}
	for range 1000 {
		if err := once(t, tr, context.Background(), Override{}); err != nil {
			t.Fatal(err)
		}
	}
	return tr, b
}

// cutsToRaise counts the hung attempts cut at timeout before one is cut
// at twice it: censorAlarm less the cuts counted since the last estimate.
// It returns -1 for a cut at another timeout.
func cutsToRaise(t *testing.T, tr *Transport, b *switchBase, timeout time.Duration) int {
	t.Helper()
	b.set(hangs)
	for n := range 2 * censorAlarm {
		start := time.Now()
		once(t, tr, context.Background(), Override{})
		switch got := time.Since(start); got {
		case timeout:
		case 2 * timeout:
			return n
		default:
			t.Logf("hung attempt %d cut after %v; want %v or %v", n+1, got, timeout, 2*timeout)
			return -1
		}
	}
	return -1
}

// startRaise starts censorAlarm attempts that hang, on wg. Their cuts at
// 15.36ms double the timeout to raisedAt. It returns 1ms after they
// started, so that an attempt begun then meets its timer after the raise.
func startRaise(t *testing.T, tr *Transport, b *switchBase, wg *sync.WaitGroup) {
	t.Helper()
	b.set(hangs)
	for range censorAlarm {
		wg.Go(func() { once(t, tr, context.Background(), Override{}) })
	}
	synctest.Wait()
	time.Sleep(time.Millisecond)
}

func TestAttemptTimeoutQuantileCountsEachCutOnce(t *testing.T) {
	// Each scenario runs under a measured timeout of 15.36ms, with no cut
	// counted yet, and returns how many cuts it should have counted (at
	// least lo, at most hi). Then hung attempts are cut until the timeout
	// doubles: censorAlarm of them, less the cuts counted.
	type scenario func(t *testing.T, tr *Transport, b *switchBase) (lo, hi int)
	tests := []struct {
		name    string
		policy  Policy
		perHost bool
		trials  int // for a race at one instant: each order must count right
		run     scenario
	}{
		{"a hung attempt cut", Policy{}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(hangs)
			if err := once(t, tr, context.Background(), Override{}); !errors.Is(err, ErrAttemptTimeout) {
				t.Errorf("got %v; want ErrAttemptTimeout", err)
			}
			return 1, 1
		}},
		{"an answer as the timer fires: a cut or a latency, not both", Policy{}, false, 20, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(answersAfter(cutAt, func(r *http.Request) io.ReadCloser {
				return &delayedBody{ctx: r.Context(), delay: cutAt}
			}))
			resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(WithOverride(context.Background(), Override{MaxAttempts: 1})))
			if errors.Is(err, ErrAttemptTimeout) {
				return 1, 1
			} else if err != nil {
				t.Fatalf("got %v; want the answer or ErrAttemptTimeout", err)
			}
			got, err := io.ReadAll(resp.Body) // a timer that lost the race cuts no body
			resp.Body.Close()
			if err != nil || string(got) != "ok" {
				t.Errorf("body: got %q, %v; want \"ok\", nil", got, err)
			}
			return 0, 0
		}},
		{"the caller's context ends as the timer fires", Policy{}, false, 20, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(hangs)
			ctx, cancel := context.WithTimeout(context.Background(), cutAt)
			defer cancel()
			once(t, tr, ctx, Override{}) // a cut or the caller's end, by which runs first
			return 0, 1                  // a cut made while the caller waited is counted
		}},
		{"Override.Timeout ends as the timer fires", Policy{}, false, 20, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(hangs)
			once(t, tr, context.Background(), Override{Timeout: cutAt})
			return 0, 1
		}},
		{"the caller gives up after the cut, before a slow base returns", Policy{}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(func(r *http.Request) (*http.Response, error) {
				<-r.Context().Done()
				time.Sleep(5 * time.Millisecond) // slow to end what was canceled
				return nil, r.Context().Err()
			})
			ctx, cancel := context.WithTimeout(context.Background(), cutAt+time.Millisecond)
			defer cancel()
			once(t, tr, ctx, Override{})
			return 1, 1 // the cut was made while the caller waited
		}},
		{"a cut by Override.AttemptTimeout is not counted", Policy{}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(hangs)
			if err := once(t, tr, context.Background(), Override{AttemptTimeout: 5 * time.Millisecond}); !errors.Is(err, ErrAttemptTimeout) {
				t.Errorf("got %v; want ErrAttemptTimeout", err)
			}
			return 0, 0
		}},
		{"a retry after a cut, cut too: two cuts", Policy{BaseDelay: time.Millisecond}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(hangs)
			var n int
			tr.OnAttempt = func(a Attempt) {
				n++
				if !errors.Is(a.Err, ErrAttemptTimeout) || a.Duration != cutAt {
					t.Errorf("attempt %d: got %v after %v; want ErrAttemptTimeout after %v", a.Number, a.Err, a.Duration, cutAt)
				}
			}
			defer func() { tr.OnAttempt = nil }()
			once(t, tr, context.Background(), Override{MaxAttempts: 2})
			if n != 2 {
				t.Errorf("got %d attempts; want 2", n)
			}
			return 2, 2
		}},
		{"a cut answer and its retry's answer: one cut", Policy{BaseDelay: time.Millisecond}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			var mu sync.Mutex
			n := 0
			b.set(func(r *http.Request) (*http.Response, error) {
				mu.Lock()
				n++
				first := n == 1
				mu.Unlock()
				if first {
					return hangs(r)
				}
				return answersAfter(10*time.Millisecond, nil)(r)
			})
			if err := once(t, tr, context.Background(), Override{MaxAttempts: 2}); err != nil {
				t.Errorf("got %v; want the retry's answer", err)
			}
			return 1, 1
		}},
		{"Classify peeks into a body that never comes: cut", Policy{Classify: func(resp *http.Response, err error) Class {
			if resp != nil {
				io.ReadAll(resp.Body) // ends when the attempt is cut
			}
			return DefaultClassify(resp, err)
		}}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(answersAfter(time.Millisecond, func(r *http.Request) io.ReadCloser {
				return &delayedBody{ctx: r.Context(), delay: time.Hour}
			}))
			start := time.Now()
			if err := once(t, tr, context.Background(), Override{}); !errors.Is(err, ErrAttemptTimeout) || time.Since(start) != cutAt {
				t.Errorf("got %v after %v; want ErrAttemptTimeout after %v", err, time.Since(start), cutAt)
			}
			return 1, 1
		}},
		{"a body read after the response returned is not cut", Policy{}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(answersAfter(time.Millisecond, func(r *http.Request) io.ReadCloser {
				return &delayedBody{ctx: r.Context(), delay: 10 * cutAt}
			}))
			resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(WithOverride(context.Background(), Override{MaxAttempts: 1})))
			if err != nil {
				t.Fatalf("got %v; want a response", err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil || string(got) != "ok" {
				t.Errorf("body: got %q, %v; want \"ok\", nil", got, err)
			}
			return 0, 0
		}},
		{"hedged: the first copy's cut is counted, not the hedge's", Policy{HedgeDelay: 12 * time.Millisecond, HedgeRatio: 1}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			for range 10 { // requests that may be hedged, answered before their hedge: the hedge share
				if err := once(t, tr, context.Background(), Override{MaxAttempts: 2}); err != nil {
					t.Fatal(err)
				}
			}
			b.set(hangs)
			var as []Attempt
			tr.OnAttempt = func(a Attempt) { as = append(as, a) }
			defer func() { tr.OnAttempt = nil }()
			if err := once(t, tr, context.Background(), Override{MaxAttempts: 2}); !errors.Is(err, ErrAttemptTimeout) {
				t.Errorf("got %v; want ErrAttemptTimeout", err)
			}
			if len(as) != 1 || as[0].Hedges != 1 {
				t.Errorf("got %d attempts, the first with %d hedges; want 1 with 1", len(as), min(len(as), 1)*as[0].Hedges)
			}
			return 1, 1
		}},
		{"under PerHost: a cut counts on its host alone", Policy{}, true, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			b.set(hangs)
			once(t, tr, context.Background(), Override{})
			other, _ := http.NewRequest("GET", "http://other.test/", nil)
			if _, err := tr.RoundTrip(other.WithContext(WithOverride(context.Background(), Override{MaxAttempts: 1}))); !errors.Is(err, ErrAttemptTimeout) {
				t.Errorf("other.test: got %v; want ErrAttemptTimeout", err)
			}
			return 1, 1
		}},
		{"under PropagateDeadline", Policy{PropagateDeadline: true}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			var got string
			b.set(func(r *http.Request) (*http.Response, error) {
				got = r.Header.Get("Request-Timeout-Ms")
				return hangs(r)
			})
			once(t, tr, context.Background(), Override{})
			if want := "15"; got != want {
				t.Errorf("Request-Timeout-Ms: got %q; want %q", got, want)
			}
			return 1, 1
		}},
		{"under a RateLimiter", Policy{}, false, 1, func(t *testing.T, tr *Transport, b *switchBase) (int, int) {
			tr.Limiter = &RateLimiter{}
			b.set(hangs)
			once(t, tr, context.Background(), Override{})
			return 1, 1
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for trial := range tc.trials {
				synctest.Test(t, func(t *testing.T) {
					var ph *PerHost
					if tc.perHost {
						ph = &PerHost{}
					}
					tr, b := measuredAt15ms(t, tc.policy, ph)
					lo, hi := tc.run(t, tr, b)
					got := censorAlarm - cutsToRaise(t, tr, b, cutAt)
					if got < lo || got > hi {
						t.Errorf("trial %d: cuts counted: got %d; want %d to %d", trial, got, lo, hi)
					}
				})
			}
		})
	}
}

func TestAttemptTimeoutQuantileEndedAttemptCountsNoCut(t *testing.T) {
	// Four hung attempts start, and 1ms later one whose base panics (or
	// exits its goroutine) after 15.36ms, as its timer fires. The four
	// cuts double the timeout to 30.72ms before that timer fires. The
	// attempt that ended must not be stretched on and counted as a cut at
	// 30.72ms: four more cuts at 30.72ms double the timeout again.
	tests := []struct {
		name string
		end  func()
	}{
		{"panic", func() { panic("base") }},
		{"runtime.Goexit", runtime.Goexit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			for trial := range 40 { // the timer and the end race at one instant
				synctest.Test(t, func(t *testing.T) {
					tr, b := measuredAt15ms(t, Policy{}, nil)
					var wg sync.WaitGroup
					startRaise(t, tr, b, &wg)
					b.set(func(*http.Request) (*http.Response, error) {
						time.Sleep(cutAt)
						tc.end()
						return nil, nil
					})
					wg.Go(func() {
						defer func() { recover() }()
						once(t, tr, context.Background(), Override{})
					})
					wg.Wait()
					time.Sleep(time.Second) // a timer left running fires
					if got := cutsToRaise(t, tr, b, raisedAt); got != censorAlarm {
						t.Errorf("trial %d: hung attempts cut at %v before the next raise: got %d; want %d", trial, raisedAt, got, censorAlarm)
					}
				})
			}
		})
	}
}

func TestAttemptTimeoutQuantileStretchedCutNamesItsTimeout(t *testing.T) {
	// Four hung attempts start, and 1ms later a fifth. The four cuts double
	// the timeout to 30.72ms before the fifth's timer fires, so it runs on
	// to 30.72ms: its Attempt and error say so, and its cut is counted
	// once, against the raised timeout.
	synctest.Test(t, func(t *testing.T) {
		tr, b := measuredAt15ms(t, Policy{}, nil)
		var wg sync.WaitGroup
		startRaise(t, tr, b, &wg)
		var a Attempt
		tr.OnAttempt = func(got Attempt) { a = got }
		err := once(t, tr, context.Background(), Override{})
		tr.OnAttempt = nil
		wg.Wait()
		if !errors.Is(err, ErrAttemptTimeout) || !strings.Contains(err.Error(), "after 30.72ms") {
			t.Errorf("got %v; want ErrAttemptTimeout after 30.72ms", err)
		}
		if a.Duration != raisedAt || !errors.Is(a.Err, ErrAttemptTimeout) {
			t.Errorf("Attempt: got %v after %v; want ErrAttemptTimeout after %v", a.Err, a.Duration, raisedAt)
		}
		if got := cutsToRaise(t, tr, b, raisedAt); got != censorAlarm-1 {
			t.Errorf("hung attempts cut at %v before the next raise: got %d; want %d", raisedAt, got, censorAlarm-1)
		}
	})
}
