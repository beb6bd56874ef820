package retryhttptest_test

// These two tests are the package's usage examples: copy them into your own
// tests. (They are tests, not Example functions, because both helpers need
// the *testing.T of a running test.)

import (
	"net/http"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/retryhttptest"
)

// A Server on loopback checks what really crossed the wire: here, that a
// charge retried after two 503s carried one idempotency key and was performed
// once. Real time: keep the client's delays short.
func TestUsageServer(t *testing.T) {
	srv := retryhttptest.NewServer(t, retryhttptest.Status(503).Times(2), retryhttptest.Status(201))

	client := &http.Client{Transport: &retryhttp.Transport{
		Policy: retryhttp.Policy{BaseDelay: time.Millisecond},
	}}
	resp, err := client.Post(srv.URL+"/charges", "application/json", strings.NewReader(`{"amount":100}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	if resp.StatusCode != 201 {
		t.Errorf("got %d; want 201", resp.StatusCode)
	}
	retryhttptest.AssertAttempts(t, srv, 3)
	retryhttptest.AssertStableKey(t, srv)
	if got := srv.Effects(); got != 1 {
		t.Errorf("got %d charges; want 1", got)
	}
}

// With a Transport as the base, a testing/synctest bubble runs the backoff
// in fake time: the waits are exact, and take no real time.
func TestUsageSynctest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := retryhttptest.NewTransport(retryhttptest.RetryAfter(429, "2"), retryhttptest.Status(200))
		tr := &retryhttp.Transport{Base: base}
		req, _ := http.NewRequest("GET", "http://api.test/items", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()

		retryhttptest.AssertAttempts(t, base, 2)
		// Retry-After: 2, waited up to 10% longer, never shorter.
		if gap := retryhttptest.Gaps(base)[0]; gap < 2*time.Second || gap > 2200*time.Millisecond {
			t.Errorf("got a wait of %v; want within [2s, 2.2s]", gap)
		}
	})
}
