package integration

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	rht "github.com/herdproof/retryhttp/retryhttptest"
	"github.com/stripe/stripe-go/v82"
)

const customer = `{"id":"cus_123","object":"customer","email":"a@example.com"}`

func stripeClient(url string, tr http.RoundTripper) *stripe.Client {
	return stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
		HTTPClient:        &http.Client{Transport: tr},
		URL:               stripe.String(url),
		MaxNetworkRetries: stripe.Int64(0), // one retrying layer: the Transport
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})))
}

// stripe-go sets its own Idempotency-Key on every POST (a key of the
// caller's, or one it makes). The Transport keeps it, verbatim, on every
// attempt, and adds no second one.
func TestStripeKeepsItsIdempotencyKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		key  *string
	}{{"the caller's key", stripe.String("order-42")}, {"stripe-go's own key", nil}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := rht.NewServer(t, rht.Status(503).WithBody(`{"error":{"type":"api_error"}}`), rht.Status(200).WithBody(customer))
			tr := &retryhttp.Transport{Policy: retryhttp.Policy{BaseDelay: time.Millisecond}}
			sc := stripeClient(srv.URL, tr)
			params := &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")}
			params.IdempotencyKey = tc.key
			c, err := sc.V1Customers.Create(context.Background(), params)
			if err != nil {
				t.Fatal(err)
			}
			if c.ID != "cus_123" {
				t.Errorf("got customer %q; want cus_123", c.ID)
			}
			rht.AssertAttempts(t, srv, 2)
			rht.AssertStableKey(t, srv)
			for i, a := range srv.Attempts() {
				if vs := a.Header.Values("Idempotency-Key"); len(vs) != 1 {
					t.Errorf("attempt %d: got Idempotency-Key %q; want exactly one", i+1, vs)
				}
				if tc.key != nil && a.Key != *tc.key {
					t.Errorf("attempt %d: got key %q; want the caller's %q", i+1, a.Key, *tc.key)
				}
			}
			if srv.Effects() != 1 {
				t.Errorf("got %d customers created; want 1", srv.Effects())
			}
		})
	}
}

// Stripe's Stripe-Should-Retry: false is the server's own word against a
// retry, and stripe-go alone makes one attempt. With stripe-go's retries
// off, as the guide says, the Transport is the one layer, and ignores it.
func TestStripeShouldRetry(t *testing.T) {
	for _, tc := range []struct {
		name string
		step rht.Step
		want int // attempts stripe-go itself makes (MaxNetworkRetries 2)
	}{
		{"503, Stripe-Should-Retry: false", rht.Status(503).WithHeader("Stripe-Should-Retry", "false").WithBody(`{"error":{"type":"api_error"}}`), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The oracle: stripe-go alone, with its own retries on.
			alone := rht.NewServer(t, tc.step)
			stripe.NewClient("sk_test_123", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
				URL: stripe.String(alone.URL), MaxNetworkRetries: stripe.Int64(2),
				LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
			}))).V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")})
			if got := len(alone.Attempts()); got != tc.want {
				t.Fatalf("stripe-go alone made %d attempts; the test expects %d", got, tc.want)
			}
			srv := rht.NewServer(t, tc.step)
			sc := stripeClient(srv.URL, &retryhttp.Transport{Policy: retryhttp.Policy{BaseDelay: time.Millisecond}})
			sc.V1Customers.Create(context.Background(), &stripe.CustomerCreateParams{Email: stripe.String("a@example.com")})
			if got := len(srv.Attempts()); got != tc.want {
				t.Errorf("got %d attempts under the guide's setup; want %d, as stripe-go alone makes", got, tc.want)
			}
		})
	}
}
