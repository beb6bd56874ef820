package retryhttp

import (
	"math"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestDelayWindows(t *testing.T) {
	const base, limit = 50 * time.Millisecond, 20 * time.Second
	tests := []struct {
		jitter   Jitter
		n        int
		prev     time.Duration
		low, hi  time.Duration // the window's ends, both reachable
		wantName string
	}{
		{FullJitter, 0, 0, 0, 50 * time.Millisecond, "full"},
		{FullJitter, 3, 0, 0, 400 * time.Millisecond, "full"},
		{FullJitter, 9, 0, 0, limit, "full"}, // 50ms*512 = 25.6s, capped
		{EqualJitter, 0, 0, 25 * time.Millisecond, 50 * time.Millisecond, "equal"},
		{EqualJitter, 2, 0, 100 * time.Millisecond, 200 * time.Millisecond, "equal"},
		{DecorrelatedJitter, 0, 0, base, 150 * time.Millisecond, "decorrelated"},
		{DecorrelatedJitter, 5, time.Second, base, 3 * time.Second, "decorrelated"},
		{DecorrelatedJitter, 5, 10 * time.Second, base, limit, "decorrelated"},
		{NoJitter, 0, 0, 50 * time.Millisecond, 50 * time.Millisecond, "none"},
		{NoJitter, 4, 0, 800 * time.Millisecond, 800 * time.Millisecond, "none"},
	}
	for _, tc := range tests {
		t.Run(tc.jitter.String()+"/n="+itoa(tc.n), func(t *testing.T) {
			if tc.jitter.String() != tc.wantName {
				t.Errorf("got name %q; want %q", tc.jitter.String(), tc.wantName)
			}
			if got := tc.jitter.Delay(tc.n, base, limit, tc.prev, lowRand); got != tc.low {
				t.Errorf("got low end %v; want %v", got, tc.low)
			}
			if got := tc.jitter.Delay(tc.n, base, limit, tc.prev, highRand); got != tc.hi {
				t.Errorf("got high end %v; want %v", got, tc.hi)
			}
			r := rand.New(rand.NewPCG(1, uint64(tc.n)))
			for range 1000 {
				if got := tc.jitter.Delay(tc.n, base, limit, tc.prev, r.Int64N); got < tc.low || got > tc.hi {
					t.Fatalf("got %v; want within [%v, %v]", got, tc.low, tc.hi)
				}
			}
		})
	}
}

func TestDelayNeverOverflows(t *testing.T) {
	for _, j := range []Jitter{FullJitter, EqualJitter, DecorrelatedJitter, NoJitter} {
		for _, n := range []int{-1, 0, 30, 62, 63, 64, 1000, math.MaxInt} {
			for _, limit := range []time.Duration{time.Second, math.MaxInt64} {
				got := j.Delay(n, time.Hour, limit, math.MaxInt64, highRand)
				if got < 0 || got > limit {
					t.Errorf("%v n=%d limit=%v: got %v; want within [0, limit]", j, n, limit, got)
				}
			}
		}
	}
}

func TestFullJitterIsUniform(t *testing.T) {
	// 100,000 draws into 10 bins of [0, 1s]: each bin within 5% of 10,000.
	r := rand.New(rand.NewPCG(7, 7))
	var bins [10]int
	for range 100_000 {
		d := FullJitter.Delay(0, time.Second, time.Minute, 0, r.Int64N)
		bins[min(int(d*10/time.Second), 9)]++
	}
	for i, c := range bins {
		if c < 9500 || c > 10500 {
			t.Errorf("bin %d: got %d draws; want 10,000 ± 500", i, c)
		}
	}
}

func TestPolicyDefaults(t *testing.T) {
	var p Policy
	if got := p.maxAttempts(); got != 3 {
		t.Errorf("MaxAttempts: got %d; want 3", got)
	}
	if got := p.baseDelay(Transient); got != 50*time.Millisecond {
		t.Errorf("BaseDelay: got %v; want 50ms", got)
	}
	if got := p.baseDelay(Throttling); got != time.Second {
		t.Errorf("ThrottleBaseDelay: got %v; want 1s", got)
	}
	if got := p.maxDelay(); got != 20*time.Second {
		t.Errorf("MaxDelay: got %v; want 20s", got)
	}
	if got := p.maxServerDelay(); got != 20*time.Second {
		t.Errorf("MaxServerDelay: got %v; want 20s", got)
	}
	if got := p.idempotencyHeader(); got != "Idempotency-Key" {
		t.Errorf("IdempotencyHeader: got %q; want Idempotency-Key", got)
	}
	req, _ := http.NewRequest("POST", "http://x.test/", nil)
	if got := len((&Transport{}).withNewKey(req, req, p.idempotencyHeader()).Header.Get(DefaultIdempotencyHeader)); got != 36 {
		t.Errorf("key length: got %d; want 36", got)
	}
}

// Policy.Rand is a hook: one that strays outside [0, n) (an off-by-one, a
// negative draw, a generator of int64s) must not make a wait longer than
// MaxDelay, a negative wait, or turn a server's Retry-After into
// StopServerDelay.
func TestRandOutOfRangeStaysInTheWindow(t *testing.T) {
	for _, tc := range []struct {
		name string
		rnd  func(int64) int64
	}{
		{"n", func(n int64) int64 { return n }},
		{"-1", func(int64) int64 { return -1 }},
		{"MaxInt64", func(int64) int64 { return math.MaxInt64 }},
	} {
		for _, hdr := range []string{"", "0"} {
			t.Run(tc.name+"/Retry-After:"+hdr, func(t *testing.T) {
				step := rht.Status(503)
				if hdr != "" {
					step = step.WithHeader("Retry-After", hdr)
				}
				var seen []Attempt
				tr := &Transport{Base: rht.NewTransport(step, rht.Status(200)),
					Policy:    Policy{Rand: tc.rnd, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond, Timeout: 2 * time.Second},
					OnAttempt: func(a Attempt) { seen = append(seen, a) }}
				roundTrip(t, tr, newReq(t, "GET", ""))
				if len(seen) == 0 {
					t.Fatal("no attempt")
				}
				a := seen[0]
				if a.Decision != Retry || a.Delay < 0 || a.Delay > 10*time.Millisecond {
					t.Errorf("got %v after %v; want a retry within [0, MaxDelay 10ms]", a.Decision, a.Delay)
				}
			})
		}
	}
}
