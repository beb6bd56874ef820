package retryhttp

import (
	"math"
	"net/http"
	"testing"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

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
	if got := len((&Transport{}).withNewKey(req, req, p.idempotencyHeader()).Header.Get(defaultIdempotencyHeader)); got != 36 {
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
