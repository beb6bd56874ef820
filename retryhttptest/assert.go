package retryhttptest

import (
	"testing"
	"time"
)

// AssertAttempts reports a test error unless r received exactly want
// attempts, and returns whether it did.
func AssertAttempts(t testing.TB, r Recorder, want int) bool {
	t.Helper()
	if got := len(r.Attempts()); got != want {
		t.Errorf("got %d attempts; want %d", got, want)
		return false
	}
	return true
}

// AssertStableKey reports a test error unless every attempt r received
// carried the same, non-empty Idempotency-Key, and returns whether they did.
func AssertStableKey(t testing.TB, r Recorder) bool {
	t.Helper()
	as := r.Attempts()
	if len(as) == 0 {
		t.Error("got no attempts; want at least one with an Idempotency-Key")
		return false
	}
	for i, a := range as {
		if a.Key == "" {
			t.Errorf("attempt %d: got no idempotency key; want the same key on every attempt", i+1)
			return false
		}
		if a.Key != as[0].Key {
			t.Errorf("attempt %d: got key %q; want %q, the key of attempt 1, on every attempt", i+1, a.Key, as[0].Key)
			return false
		}
	}
	return true
}

// Gaps returns the time between consecutive attempts r received: the waits
// a client made, plus the time each attempt took.
func Gaps(r Recorder) []time.Duration {
	as := r.Attempts()
	var gaps []time.Duration
	for i := 1; i < len(as); i++ {
		gaps = append(gaps, as[i].Time.Sub(as[i-1].Time))
	}
	return gaps
}

// Keys returns the Idempotency-Key of each attempt r received, "" where
// there was none.
func Keys(r Recorder) []string {
	var keys []string
	for _, a := range r.Attempts() {
		keys = append(keys, a.Key)
	}
	return keys
}
