package retryhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// FuzzParseRetryAfter: whatever the three headers hold, the result is never
// negative, "not asked" is always zero, and the same input gives the same
// answer. The seed corpus is in testdata/fuzz/FuzzParseRetryAfter.
func FuzzParseRetryAfter(f *testing.F) {
	f.Add("", "", "120")
	f.Add("1500", "", "")
	f.Add("", "250", "Sun, 29 Nov 2026 12:00:30 GMT")
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, amz, ms, ra string) {
		h := http.Header{}
		for name, v := range map[string]string{headerAmzRetryAfter: amz, headerRetryAfterMs: ms, headerRetryAfter: ra} {
			if v != "" {
				h[name] = []string{v}
			}
		}
		d, ok := parseRetryAfter(h, now)
		if d < 0 {
			t.Fatalf("got %v for %q; want a non-negative delay", d, h)
		}
		if !ok && d != 0 {
			t.Fatalf("got (%v, false) for %q; want 0 when no delay is asked", d, h)
		}
		if d2, ok2 := parseRetryAfter(h, now); d2 != d || ok2 != ok {
			t.Fatalf("got (%v, %v) then (%v, %v) for %q; want the same twice", d, ok, d2, ok2, h)
		}
	})
}

// FuzzTransport drives the Transport through arbitrary scripts of outcomes
// and policies in fake time, and checks the contract every time: a response
// or an error, never both or neither; no more attempts than MaxAttempts;
// every discarded body closed; the budget within [0, capacity]; the whole
// exchange inside the deadline.
func FuzzTransport(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3}, uint8(3), uint8(0), uint16(0), false, "GET")
	f.Add([]byte{4, 4, 4, 4, 4}, uint8(5), uint8(1), uint16(300), true, "POST")
	f.Add([]byte{5, 6, 7, 8, 9}, uint8(4), uint8(3), uint16(50), false, "PATCH")
	f.Fuzz(func(t *testing.T, script []byte, maxAttempts, jitter uint8, timeoutMs uint16, noKeys bool, method string) {
		if len(script) > 16 || !validMethod(method) {
			return
		}
		steps := []rht.Step{}
		for _, b := range script {
			steps = append(steps, fuzzStep(b))
		}
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(steps...)
			budget := newTokenBucket(100)
			p := Policy{
				MaxAttempts: int(maxAttempts%6) + 1,
				Jitter:      Jitter(jitter % 4), // 3: past the last, read as FullJitter
				Timeout:     time.Duration(timeoutMs) * time.Millisecond,
				BaseDelay:   10 * time.Millisecond,
				MaxDelay:    time.Second,
			}
			if noKeys {
				p.NewIdempotencyKey = noKey
			}
			tr := &Transport{Base: base, Policy: p, Budget: budget}
			req, err := http.NewRequest(method, "http://fuzz.test/", nil)
			if err != nil {
				return
			}
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			elapsed := time.Since(start)
			switch {
			case resp != nil && err != nil:
				t.Fatalf("got a response and an error (%v)", err)
			case resp == nil && err == nil:
				t.Fatal("got neither a response nor an error")
			case err != nil:
				var re *Error
				if !errors.As(err, &re) {
					t.Fatalf("got %T %v; want an *Error", err, err)
				}
			default:
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if n := len(base.Attempts()); n < 1 || n > p.MaxAttempts {
				t.Fatalf("got %d attempts; want 1 to %d", n, p.MaxAttempts)
			}
			if open := base.OpenBodies(); open != 0 {
				t.Fatalf("got %d response bodies open; want 0", open)
			}
			if a := budget.Available(); a < 0 || a > 100 {
				t.Fatalf("got %d tokens; want within [0, 100]", a)
			}
			if p.Timeout > 0 && elapsed > p.Timeout {
				t.Fatalf("took %v; want within the %v timeout", elapsed, p.Timeout)
			}
		})
	})
}

func validMethod(m string) bool {
	switch m {
	case "GET", "HEAD", "PUT", "DELETE", "POST", "PATCH", "OPTIONS":
		return true
	}
	return false
}

// fuzzStep maps a byte onto an outcome, server delays included.
func fuzzStep(b byte) rht.Step {
	codes := []int{200, 503, 502, 504, 429, 500, 404, 204}
	switch b % 12 {
	case 8:
		return rht.Step{Err: context.DeadlineExceeded}
	case 9:
		return rht.Reset()
	case 10:
		return rht.CommitThenDrop()
	case 11:
		return rht.Status(503).WithHeader("Retry-After", []string{"0", "1", "30", "-1", "x"}[int(b/12)%5])
	}
	return rht.Status(codes[b%12])
}
