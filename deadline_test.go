package retryhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// headers records the Request-Timeout-Ms header of every attempt a base
// sees, "-" for none, and answers each from answers in turn (the last one
// for the rest), after delay.
type headers struct {
	mu      sync.Mutex
	got     []string
	answers []int
	delay   time.Duration
}

func (h *headers) RoundTrip(r *http.Request) (*http.Response, error) {
	h.mu.Lock()
	v := "-"
	if vs, ok := r.Header["Request-Timeout-Ms"]; ok {
		v = strings.Join(vs, ",")
	}
	h.got = append(h.got, v)
	code := h.answers[min(len(h.got), len(h.answers))-1]
	h.mu.Unlock()
	if h.delay > 0 {
		time.Sleep(h.delay)
	}
	return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

func (h *headers) values() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

func TestPropagateDeadlineHeader(t *testing.T) {
	tests := []struct {
		name     string
		policy   Policy
		deadline time.Duration // the context's; 0 for none
		caller   string        // the caller's own Request-Timeout-Ms, if any
		want     []string
	}{
		{"context deadline: 1000, then 900 after a 100ms wait", Policy{PropagateDeadline: true}, time.Second, "", []string{"1000", "900"}},
		{"Policy.Timeout, sooner than the context's", Policy{PropagateDeadline: true, Timeout: 500 * time.Millisecond}, time.Second, "", []string{"500", "400"}},
		{"the context's, sooner than Policy.Timeout", Policy{PropagateDeadline: true, Timeout: time.Minute}, 250 * time.Millisecond, "", []string{"250", "150"}},
		{"no deadline: no header", Policy{PropagateDeadline: true}, 0, "", []string{"-", "-"}},
		{"a deadline that is not a whole millisecond is rounded down", Policy{PropagateDeadline: true}, 1500 * time.Microsecond, "", []string{"1"}},
		{"the caller's header is replaced on the attempt", Policy{PropagateDeadline: true}, time.Second, "77", []string{"1000", "900"}},
		{"off: the caller's header goes as it is", Policy{}, time.Second, "77", []string{"77", "77"}},
		{"off: no header", Policy{}, time.Second, "", []string{"-", "-"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &headers{answers: []int{503, 200}}
				p := tc.policy
				p.BaseDelay, p.Rand = 100*time.Millisecond, highRand // the first wait is 100ms
				tr := &Transport{Base: base, Policy: p}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				req := newReq(t, "GET", "").WithContext(ctx)
				if tc.caller != "" {
					req.Header.Set("Request-Timeout-Ms", tc.caller)
				}
				roundTrip(t, tr, req)
				if got := base.values(); strings.Join(got, " ") != strings.Join(tc.want, " ") {
					t.Errorf("got headers %v; want %v", got, tc.want)
				}
				if got := req.Header.Get("Request-Timeout-Ms"); got != tc.caller {
					t.Errorf("got the caller's header %q after RoundTrip; want %q (never modified)", got, tc.caller)
				}
			})
		})
	}
}

func TestPropagateDeadlineHedgedCopies(t *testing.T) {
	// Each hedged copy carries the time left when it is sent.
	synctest.Test(t, func(t *testing.T) {
		base := &headers{answers: []int{200}, delay: 50 * time.Millisecond}
		tr := &Transport{Base: base, Policy: Policy{PropagateDeadline: true, HedgeDelay: 20 * time.Millisecond, HedgeRatio: 1}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
		time.Sleep(time.Second) // the copy that lost answers
		synctest.Wait()
		if got, want := strings.Join(base.values(), " "), "1000 980"; got != want {
			t.Errorf("got headers %q; want %q", got, want)
		}
	})
}

// warm sends n requests through tr, each answered by base after its delay,
// so that the Transport's latency estimate forms.
func warm(t *testing.T, tr *Transport, n int) {
	t.Helper()
	for range n {
		ctx := WithOverride(context.Background(), Override{MaxAttempts: 1})
		resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
}

func TestPropagateDeadlineFailsFast(t *testing.T) {
	// Attempts that take 100ms: the estimate of the time an attempt needs
	// (a tenth of them are quicker) is the bottom of 100ms's bucket, 81.92ms,
	// after 20 of them.
	const need = 81920 * time.Microsecond
	t.Run("a first attempt that cannot end in time is not sent", func(t *testing.T) {
		for _, tc := range []struct {
			left     time.Duration
			attempts int
		}{{need, 0}, {need + time.Microsecond, 1}} {
			synctest.Test(t, func(t *testing.T) {
				base := &headers{answers: []int{200}, delay: 100 * time.Millisecond}
				var end Report
				tr := &Transport{Base: base, Policy: Policy{PropagateDeadline: true}, OnEnd: func(_ *http.Request, r Report) { end = r }}
				warm(t, tr, 20)
				ctx, cancel := context.WithTimeout(context.Background(), tc.left)
				defer cancel()
				start := time.Now()
				resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
				if tc.attempts == 0 {
					var re *Error
					if !errors.As(err, &re) || re.Decision != StopDeadline || re.Attempts != 0 || !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("%v left: got (%v, %v); want an *Error, %v after 0 attempts, wrapping context.DeadlineExceeded", tc.left, resp, err, StopDeadline)
					}
					if got := time.Since(start); got != 0 {
						t.Errorf("got %v elapsed; want 0 (refused at once)", got)
					}
					if end.Decision != StopDeadline || end.Attempts != 0 {
						t.Errorf("got OnEnd's %v after %d attempts; want %v after 0", end.Decision, end.Attempts, StopDeadline)
					}
				} else if err != nil {
					t.Fatalf("%v left: got %v; want the attempt sent", tc.left, err)
				} else {
					resp.Body.Close()
				}
				if got := len(base.values()) - 20; got != tc.attempts {
					t.Errorf("%v left: got %d attempts; want %d", tc.left, got, tc.attempts)
				}
			})
		}
	})
	t.Run("a retry that cannot end in time is not waited for", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &headers{answers: []int{503}, delay: 100 * time.Millisecond}
			var decisions []Decision
			tr := &Transport{Base: base, Policy: Policy{PropagateDeadline: true, MaxAttempts: 10, Rand: lowRand},
				Budget: newTokenBucket(1 << 30), OnAttempt: func(a Attempt) { decisions = append(decisions, a.Decision) }}
			warm(t, tr, 20)
			decisions = nil
			ctx, cancel := context.WithTimeout(context.Background(), 550*time.Millisecond)
			defer cancel()
			start := time.Now()
			code, _, err := roundTrip(t, tr, newReq(t, "GET", "").WithContext(ctx))
			// Attempts at 0, 100, 200, 300 and 400ms; at 500ms, 81.92ms more
			// would end past 550ms: the last 503 is returned.
			if err != nil || code != 503 {
				t.Fatalf("got (%d, %v); want the 503", code, err)
			}
			if got := time.Since(start); got != 500*time.Millisecond {
				t.Errorf("got %v elapsed; want 500ms", got)
			}
			want := []Decision{Retry, Retry, Retry, Retry, StopDeadline}
			if len(decisions) != len(want) || decisions[4] != StopDeadline {
				t.Errorf("got decisions %v; want %v", decisions, want)
			}
		})
	})
	t.Run("a retry after an error: the error wraps context.DeadlineExceeded", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var calls atomic.Int32
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				time.Sleep(100 * time.Millisecond)
				if calls.Add(1) <= 20 {
					return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
				}
				return nil, errReset
			})
			tr := &Transport{Base: base, Policy: Policy{PropagateDeadline: true, Rand: lowRand}}
			warm(t, tr, 20)
			ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
			defer cancel()
			_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
			var re *Error
			if !errors.As(err, &re) || re.Decision != StopDeadline || re.Attempts != 1 ||
				!errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, errReset) {
				t.Errorf("got %v; want an *Error, %v after 1 attempt, wrapping context.DeadlineExceeded and the attempt's error", err, StopDeadline)
			}
		})
	})
	t.Run("off: the attempt is sent and cut by the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &headers{answers: []int{200}, delay: 100 * time.Millisecond}
			tr := &Transport{Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				resp, _ := base.RoundTrip(r)
				if err := r.Context().Err(); err != nil {
					return nil, err
				}
				return resp, nil
			})}
			warm(t, tr, 20)
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
			var re *Error
			if !errors.As(err, &re) || re.Decision != StopCanceled || re.Attempts != 1 {
				t.Errorf("got %v; want %v after 1 attempt", err, StopCanceled)
			}
		})
	})
	t.Run("PerHost: each destination's estimate", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			slow := &headers{answers: []int{200}, delay: 100 * time.Millisecond}
			fast := &headers{answers: []int{200}, delay: time.Millisecond}
			tr := &Transport{PerHost: &PerHost{}, Policy: Policy{PropagateDeadline: true},
				Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					if r.URL.Host == "slow.test" {
						return slow.RoundTrip(r)
					}
					return fast.RoundTrip(r)
				})}
			for _, host := range []string{"slow.test", "fast.test"} {
				for range 20 {
					req, _ := http.NewRequest("GET", "http://"+host+"/", nil)
					resp, err := tr.RoundTrip(req)
					if err != nil {
						t.Fatal(err)
					}
					resp.Body.Close()
				}
			}
			for _, tc := range []struct {
				host string
				sent bool
			}{{"slow.test", false}, {"fast.test", true}} {
				ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+tc.host+"/", nil)
				resp, err := tr.RoundTrip(req)
				cancel()
				if sent := err == nil; sent != tc.sent {
					t.Errorf("%s with 50ms left: got error %v; want sent %v", tc.host, err, tc.sent)
				}
				if err == nil {
					resp.Body.Close()
				}
			}
		})
	})
}

// deadlineSeen serves a request through Handler and returns the time its
// context has left, as next sees it, or -1 for no deadline.
func deadlineSeen(t *testing.T, ctx context.Context, values []string) time.Duration {
	t.Helper()
	left := time.Duration(-2)
	h := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		left = -1
		if d, ok := r.Context().Deadline(); ok {
			left = time.Until(d)
		}
		if got := r.Header["Request-Timeout-Ms"]; strings.Join(got, ",") != strings.Join(values, ",") {
			t.Errorf("got header %q in the handler; want %q untouched", got, values)
		}
	}))
	r := httptest.NewRequest("GET", "/", nil).WithContext(ctx)
	if values != nil {
		r.Header["Request-Timeout-Ms"] = values
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != 200 {
		t.Errorf("got status %d; want 200 (bad input is never an error)", w.Code)
	}
	return left
}

func TestHandlerDeadline(t *testing.T) {
	// The request is served under the header's deadline, less 5ms for the
	// answer's way back.
	const none = time.Duration(-1)
	const margin = 5 * time.Millisecond
	tests := []struct {
		name     string
		values   []string
		existing time.Duration // the request's own deadline; 0 for none
		want     time.Duration
	}{
		{"no header", nil, 0, none},
		{"250ms", []string{"250"}, 0, 250*time.Millisecond - margin},
		{"0: already past", []string{"0"}, 0, -margin},
		{"leading zeros", []string{"0042"}, 0, 42*time.Millisecond - margin},
		{"empty", []string{""}, 0, none},
		{"letters", []string{"abc"}, 0, none},
		{"negative", []string{"-5"}, 0, none},
		{"exponent", []string{"1e9"}, 0, none},
		{"plus sign", []string{"+5"}, 0, none},
		{"leading space", []string{" 5"}, 0, none},
		{"trailing space", []string{"5 "}, 0, none},
		{"a unit, as grpc-timeout writes it", []string{"5m"}, 0, none},
		{"a fraction", []string{"5.5"}, 0, none},
		{"two values", []string{"5", "10"}, 0, none},
		{"a list in one value", []string{"5,10"}, 0, none},
		{"longer than the ceiling: clamped to 5 minutes", []string{"300006"}, 0, 5 * time.Minute},
		{"past int64: clamped to 5 minutes", []string{"99999999999999999999"}, 0, 5 * time.Minute},
		{"sooner than the request's own deadline", []string{"50"}, 100 * time.Millisecond, 50*time.Millisecond - margin},
		{"later than the request's own deadline: it stays", []string{"500"}, 100 * time.Millisecond, 100 * time.Millisecond},
		{"no sooner, with the margin: it stays", []string{"105"}, 100 * time.Millisecond, 100 * time.Millisecond},
		{"huge, with the request's own deadline: it stays", []string{"99999999999999999999"}, time.Hour, time.Hour},
		{"malformed, with the request's own deadline: it stays", []string{"abc"}, 100 * time.Millisecond, 100 * time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx := context.Background()
				if tc.existing > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.existing)
					defer cancel()
				}
				if got := deadlineSeen(t, ctx, tc.values); got != tc.want {
					t.Errorf("got %v left in the handler; want %v", got, tc.want)
				}
			})
		})
	}
}

// serveIn answers a request by calling h in-process, with a context that
// does not end when the caller's does: only the header carries the
// deadline across, as over a hop that does not pass cancellation on.
type serveIn struct{ h http.Handler }

func (s serveIn) RoundTrip(r *http.Request) (*http.Response, error) {
	in := httptest.NewRequest(r.Method, r.URL.String(), nil)
	in.Header = r.Header.Clone()
	w := httptest.NewRecorder()
	s.h.ServeHTTP(w, in)
	return w.Result(), nil
}

func TestDeadlineAcrossServices(t *testing.T) {
	// A caller with 1s left calls A, which works 100ms, then calls B; B
	// works until its context ends. No cancellation crosses a hop: the
	// header alone ends B's work, at 1s less each Handler's 5ms margin.
	synctest.Test(t, func(t *testing.T) {
		var bLeft time.Duration
		var bEnded time.Time
		bottom := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			d, _ := r.Context().Deadline()
			bLeft = time.Until(d)
			<-r.Context().Done()
			bEnded = time.Now()
			w.WriteHeader(http.StatusGatewayTimeout)
		}))
		toB := &Transport{Base: serveIn{bottom}, Policy: Policy{PropagateDeadline: true, MaxAttempts: 1}}
		a := Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			time.Sleep(100 * time.Millisecond) // A's own work first
			req, _ := http.NewRequestWithContext(r.Context(), "GET", "http://b.test/", nil)
			resp, err := toB.RoundTrip(req)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
		}))
		caller := &Transport{Base: serveIn{a}, Policy: Policy{PropagateDeadline: true, MaxAttempts: 1}}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		start := time.Now()
		resp, err := caller.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		if bLeft != 890*time.Millisecond {
			t.Errorf("got %v left at B; want 890ms", bLeft)
		}
		if got := bEnded.Sub(start); got != 990*time.Millisecond {
			t.Errorf("B stopped after %v; want 990ms, before the caller's deadline", got)
		}
	})
}

func TestDeadlineAcrossRealServices(t *testing.T) {
	// Transport → Handler → Transport → Handler over loopback: the bottom's
	// context has the caller's deadline, less what the hops took.
	leftc := make(chan time.Duration, 1)
	bottom := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		left := time.Duration(-1)
		if d, ok := r.Context().Deadline(); ok {
			left = time.Until(d)
		}
		leftc <- left
	})))
	defer bottom.Close()
	toBottom := &Transport{Policy: Policy{PropagateDeadline: true}}
	defer toBottom.CloseIdleConnections()
	middle := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", bottom.URL, nil)
		resp, err := toBottom.RoundTrip(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		resp.Body.Close()
	})))
	defer middle.Close()
	caller := &Transport{Policy: Policy{PropagateDeadline: true}}
	defer caller.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", middle.URL, nil)
	resp, err := caller.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if left := <-leftc; left <= 9*time.Second || left > 10*time.Second {
		t.Errorf("got %v left at the bottom; want the caller's 10s less the hops (more than 9s)", left)
	}
}

// latencyBase answers 200 after the latency its func gives the attempt, or
// fails when the attempt's context ends first.
type latencyBase struct {
	n       atomic.Int64
	latency func(n int64) time.Duration // n counts from 1
}

func (b *latencyBase) RoundTrip(r *http.Request) (*http.Response, error) {
	timer := time.NewTimer(b.latency(b.n.Add(1)))
	defer timer.Stop()
	select {
	case <-timer.C:
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	case <-r.Context().Done():
		return nil, r.Context().Err()
	}
}

// attempt sends one request of one attempt and returns how long the attempt
// took and whether its timeout cut it.
func attempt(t *testing.T, tr *Transport) (time.Duration, bool) {
	t.Helper()
	var a Attempt
	tr.OnAttempt = func(got Attempt) { a = got }
	ctx := WithOverride(context.Background(), Override{MaxAttempts: 1})
	resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
	if err == nil {
		resp.Body.Close()
	}
	return a.Duration, errors.Is(a.Err, ErrAttemptTimeout)
}

func TestAttemptTimeoutQuantile(t *testing.T) {
	// A window of 1000 attempts forms the estimate: the bucket of the
	// quantile, read two buckets (each a quarter of a doubling) high.
	tests := []struct {
		name    string
		q       float64
		ceiling time.Duration
		latency func(n int64) time.Duration
		want    time.Duration
	}{
		{"all 10ms, 0.999: 10ms's bucket is up to 10.24ms, two more to 15.36ms", 0.999, time.Second,
			func(int64) time.Duration { return 10 * time.Millisecond }, 15360 * time.Microsecond},
		{"9 in 10 at 10ms, 1 at 40ms, 0.5", 0.5, time.Second,
			tenthAt40ms,
			15360 * time.Microsecond},
		{"9 in 10 at 10ms, 1 at 40ms, 0.95", 0.95, time.Second,
			tenthAt40ms,
			61440 * time.Microsecond},
		{"bounded above by AttemptTimeout", 0.999, 110 * time.Millisecond,
			func(int64) time.Duration { return 100 * time.Millisecond }, 110 * time.Millisecond},
		{"bounded below by a millisecond", 0.999, time.Second,
			func(int64) time.Duration { return 100 * time.Microsecond }, time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &latencyBase{latency: tc.latency}
				tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: tc.ceiling, AttemptTimeoutQuantile: tc.q}}
				for i := range 1000 {
					if _, cut := attempt(t, tr); cut {
						t.Fatalf("attempt %d was cut while AttemptTimeout serves", i+1)
					}
				}
				base.latency = func(int64) time.Duration { return time.Hour } // hangs
				if got, cut := attempt(t, tr); got != tc.want || !cut {
					t.Errorf("got a hung attempt cut %v after %v; want cut after %v", cut, got, tc.want)
				}
			})
		})
	}
	t.Run("AttemptTimeout serves until a full window is measured", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			var hang atomic.Bool
			base := &latencyBase{latency: func(int64) time.Duration {
				if hang.Load() {
					return time.Hour
				}
				return 10 * time.Millisecond
			}}
			tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: time.Second, AttemptTimeoutQuantile: 0.999}}
			for i := range 999 {
				attempt(t, tr)
				if i == 19 || i == 499 || i == 998 {
					hang.Store(true)
					if got, _ := attempt(t, tr); got != time.Second {
						t.Errorf("after %d attempts: a hung attempt cut after %v; want 1s", i+1, got)
					}
					hang.Store(false)
				}
			}
		})
	})
	t.Run("without AttemptTimeout, no timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := &latencyBase{latency: func(int64) time.Duration { return 10 * time.Millisecond }}
			tr := &Transport{Base: base, Policy: Policy{AttemptTimeoutQuantile: 0.999}}
			for range 1000 {
				attempt(t, tr)
			}
			base.latency = func(int64) time.Duration { return time.Minute }
			if got, cut := attempt(t, tr); got != time.Minute || cut {
				t.Errorf("got an attempt of a minute cut %v after %v; want it answered after 1m0s", cut, got)
			}
		})
	})
}

// tenthAt40ms is a latency of 10ms, but 40ms for every tenth attempt.
func tenthAt40ms(n int64) time.Duration {
	if n%10 == 0 {
		return 40 * time.Millisecond
	}
	return 10 * time.Millisecond
}

func TestAttemptTimeoutQuantilePerHost(t *testing.T) {
	// Each destination's attempts set its own timeout.
	synctest.Test(t, func(t *testing.T) {
		var hang atomic.Bool
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			d := 10 * time.Millisecond
			if r.URL.Host == "slow.test" {
				d = 100 * time.Millisecond
			}
			if hang.Load() {
				d = time.Hour
			}
			return (&latencyBase{latency: func(int64) time.Duration { return d }}).RoundTrip(r)
		})
		var a Attempt
		tr := &Transport{Base: base, PerHost: &PerHost{}, OnAttempt: func(got Attempt) { a = got },
			Policy: Policy{MaxAttempts: 1, AttemptTimeout: time.Second, AttemptTimeoutQuantile: 0.999}}
		send := func(host string) {
			req, _ := http.NewRequest("GET", "http://"+host+"/", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		for range 1000 {
			send("fast.test")
			send("slow.test")
		}
		hang.Store(true)
		for _, tc := range []struct {
			host string
			want time.Duration
		}{{"fast.test", 15360 * time.Microsecond}, {"slow.test", 143360 * time.Microsecond}} {
			send(tc.host)
			if a.Duration != tc.want {
				t.Errorf("%s: a hung attempt cut after %v; want %v", tc.host, a.Duration, tc.want)
			}
		}
	})
}

func TestAttemptTimeoutQuantileRisesWhenCut(t *testing.T) {
	// 1000 attempts of 10ms set the timeout at 15.36ms; then some attempts
	// take 30ms. The attempts the timeout cuts have unknown latencies: 4
	// cuts, more than 4 times the 0.1% the quantile allows, double it. The
	// window starts afresh, and a full one under the new timeout gives the
	// new latency's estimate.
	tests := []struct {
		name    string
		ceiling time.Duration
		slow    int64         // every slow-th attempt takes 30ms, the others 10ms
		cutAt   time.Duration // the timeout that cuts the first 4 slow ones
		raised  time.Duration // the timeout after them
		after   time.Duration // once 1000 attempts are measured under it
	}{
		{"all slow", time.Second, 1, 15360 * time.Microsecond, 30720 * time.Microsecond, 40960 * time.Microsecond},
		{"all slow, bounded by AttemptTimeout", 30500 * time.Microsecond, 1, 15360 * time.Microsecond, 30500 * time.Microsecond, 30500 * time.Microsecond},
		{"one in 20 slow", time.Second, 20, 15360 * time.Microsecond, 30720 * time.Microsecond, 40960 * time.Microsecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &latencyBase{latency: func(int64) time.Duration { return 10 * time.Millisecond }}
				tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: tc.ceiling, AttemptTimeoutQuantile: 0.999}}
				for range 1000 {
					attempt(t, tr)
				}
				var n atomic.Int64
				base.latency = func(int64) time.Duration {
					if n.Add(1)%tc.slow == 0 {
						return 30 * time.Millisecond
					}
					return 10 * time.Millisecond
				}
				for cuts := 0; cuts < 4; {
					got, cut := attempt(t, tr)
					if cut {
						cuts++
						if got != tc.cutAt {
							t.Errorf("cut %d: after %v; want %v", cuts, got, tc.cutAt)
						}
					}
				}
				slowOnly := func(int64) time.Duration { return 30 * time.Millisecond }
				base.latency = func(int64) time.Duration { return time.Hour }
				if got, _ := attempt(t, tr); got != tc.raised {
					t.Errorf("after 4 cuts: a hung attempt cut after %v; want %v", got, tc.raised)
				}
				base.latency = slowOnly
				for range 1000 {
					if _, cut := attempt(t, tr); cut {
						t.Fatalf("an attempt of 30ms cut under the raised timeout")
					}
				}
				base.latency = func(int64) time.Duration { return time.Hour }
				if got, _ := attempt(t, tr); got != tc.after {
					t.Errorf("after a full window at 30ms: a hung attempt cut after %v; want %v", got, tc.after)
				}
			})
		})
	}
}

func TestAttemptTimeoutQuantileStretchesAttemptsInFlight(t *testing.T) {
	// 1000 attempts of 10ms set the timeout at 15.36ms. Four attempts hang,
	// and 5ms later one of 20ms starts. The four are cut at 15.36ms, which
	// doubles the timeout to 30.72ms. When the 20ms attempt's timer fires,
	// the longer timeout takes over: it ends after 20ms, not cut.
	synctest.Test(t, func(t *testing.T) {
		base := &latencyBase{latency: func(n int64) time.Duration {
			switch {
			case n <= 1000:
				return 10 * time.Millisecond
			case n <= 1004:
				return time.Hour
			default:
				return 20 * time.Millisecond
			}
		}}
		tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: time.Second, AttemptTimeoutQuantile: 0.999}}
		for range 1000 {
			attempt(t, tr)
		}
		tr.OnAttempt = nil // attempt's hook is not for concurrent requests
		var wg sync.WaitGroup
		cuts := make([]time.Duration, 4)
		for i := range cuts {
			wg.Go(func() {
				ctx := WithOverride(context.Background(), Override{MaxAttempts: 1})
				start := time.Now()
				_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
				if !errors.Is(err, ErrAttemptTimeout) {
					t.Errorf("hung attempt %d: got %v; want ErrAttemptTimeout", i, err)
				}
				cuts[i] = time.Since(start)
			})
		}
		synctest.Wait()
		time.Sleep(5 * time.Millisecond)
		start := time.Now()
		ctx := WithOverride(context.Background(), Override{MaxAttempts: 1})
		resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
		if err != nil {
			t.Fatalf("the 20ms attempt: got %v; want its response", err)
		}
		resp.Body.Close()
		if got := time.Since(start); got != 20*time.Millisecond {
			t.Errorf("the 20ms attempt took %v; want 20ms", got)
		}
		wg.Wait()
		for i, got := range cuts {
			if got != 15360*time.Microsecond {
				t.Errorf("hung attempt %d cut after %v; want 15.36ms", i, got)
			}
		}
	})
}

// slowAbortBase answers after its latency, and returns from a canceled
// request only once that latency has passed too: a base, or a loaded
// machine, slow to end what was canceled.
type slowAbortBase struct {
	n       atomic.Int64
	latency func(n int64) time.Duration // n counts from 1
}

func (b *slowAbortBase) RoundTrip(r *http.Request) (*http.Response, error) {
	time.Sleep(b.latency(b.n.Add(1)))
	if err := r.Context().Err(); err != nil {
		return nil, err
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
}

func TestAttemptTimeoutQuantileCountsACutWhenItFires(t *testing.T) {
	// 1000 attempts of 10ms set the timeout at 15.36ms. Then ten of 20ms
	// start 1ms apart, on a base that returns from a canceled request only
	// after its 20ms. The first four are cut when their timers fire, at
	// 15.36ms; the fourth cut doubles the timeout at once, so the other six
	// run on to their answers. Counted only once the cut attempts returned,
	// the cuts would double it 4.64ms later, and eight attempts would be cut.
	synctest.Test(t, func(t *testing.T) {
		base := &slowAbortBase{latency: func(n int64) time.Duration {
			if n <= 1000 {
				return 10 * time.Millisecond
			}
			return 20 * time.Millisecond
		}}
		tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: time.Second, AttemptTimeoutQuantile: 0.999}}
		for range 1000 {
			attempt(t, tr)
		}
		tr.OnAttempt = nil // attempt's hook is not for concurrent requests
		var wg sync.WaitGroup
		cut := make([]bool, 10)
		for i := range cut {
			wg.Go(func() {
				ctx := WithOverride(context.Background(), Override{MaxAttempts: 1})
				resp, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
				if err == nil {
					resp.Body.Close()
				}
				cut[i] = errors.Is(err, ErrAttemptTimeout)
			})
			time.Sleep(time.Millisecond)
		}
		wg.Wait()
		want := []bool{true, true, true, true, false, false, false, false, false, false}
		if !slices.Equal(cut, want) {
			t.Errorf("attempts cut: got %v; want %v", cut, want)
		}
	})
}

func TestCallerDeadlineWinsOverAttemptCut(t *testing.T) {
	// The attempt's timer cuts it at 10ms, the caller's deadline passes at
	// 20ms, and the base, slow to abort, returns at 50ms with its attempt's
	// own cancellation. The caller learns that its deadline passed.
	tests := []struct {
		name   string
		policy Policy
	}{
		{"fixed attempt timeout", Policy{AttemptTimeout: 10 * time.Millisecond}},
		{"measured attempt timeout, before it forms", Policy{AttemptTimeout: 10 * time.Millisecond, AttemptTimeoutQuantile: 0.999}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &slowAbortBase{latency: func(int64) time.Duration { return 50 * time.Millisecond }}
				tr := &Transport{Base: base, Policy: tt.policy}
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				defer cancel()
				_, err := tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("got %v; want an error that wraps context.DeadlineExceeded", err)
				}
				var e *Error
				if !errors.As(err, &e) || e.Decision != StopCanceled {
					t.Errorf("got %v; want an *Error with StopCanceled", err)
				}
			})
		})
	}
}
