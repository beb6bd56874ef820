package herd

import (
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
)

var quick = retryhttp.Policy{BaseDelay: time.Microsecond, MaxDelay: time.Millisecond}

func TestLayersMultiply(t *testing.T) {
	for k := 1; k <= 4; k++ {
		c := NewChain(k, func(int) *retryhttp.Transport {
			return &retryhttp.Transport{Policy: quick, Budget: Unlimited()}
		})
		got := c.Call(1)
		c.Close()
		want := int64(1)
		for range k {
			want *= 3
		}
		if got != want {
			t.Errorf("k = %d: got %d attempts at the bottom for one request; want 3^%d = %d", k, got, k, want)
		}
	}
}

func TestOneRetryingLayer(t *testing.T) {
	// Retry next to the failing dependency only; every other layer makes
	// one attempt and passes the failure up.
	for k := 1; k <= 4; k++ {
		c := NewChain(k, func(i int) *retryhttp.Transport {
			p := quick
			if i < k {
				p.MaxAttempts = 1
			}
			return &retryhttp.Transport{Policy: p, Budget: Unlimited()}
		})
		got := c.Call(10)
		c.Close()
		if got != 30 {
			t.Errorf("k = %d: got %d attempts at the bottom for 10 requests; want 30", k, got)
		}
	}
}

func TestBudgetsBoundLayers(t *testing.T) {
	const requests = 1000
	c := NewChain(3, func(int) *retryhttp.Transport { return &retryhttp.Transport{Policy: quick} })
	defer c.Close()
	got := c.Call(requests)
	// Each layer's 500 tokens pay for at most 35 retries in all, and each
	// retry at layer i costs at most 3^(3-i) bottom attempts: 35·(9+3+1)
	// on top of one attempt per request.
	if limit := int64(requests + 35*(9+3+1)); got > limit {
		t.Errorf("got %d attempts at the bottom for %d requests; want at most %d", got, requests, limit)
	}
	t.Logf("3 layers, default budgets: %d attempts at the bottom for %d requests (%.2f each; 27 without budgets)", got, requests, float64(got)/requests)
}

// With every layer under retryhttp.Handler, the layer next to the failing
// dependency retries and the ones above return its failure at once: 3
// attempts at the bottom for one request, for any k, where 3^k reach it
// without the signal.
func TestSignalStopsMultiplication(t *testing.T) {
	for k := 1; k <= 4; k++ {
		for _, signal := range []bool{false, true} {
			c := StartChain(ChainConfig{K: k,
				Transport: func(int) *retryhttp.Transport {
					return &retryhttp.Transport{Policy: quick, Budget: Unlimited()}
				},
				Signal: func(int) bool { return signal },
			})
			got, ok := c.Run(1)
			c.Close()
			want := int64(3)
			if !signal {
				want = 1
				for range k {
					want *= 3
				}
			}
			if got != want || ok != 0 {
				t.Errorf("k = %d, signal %v: got %d attempts at the bottom and %d successes; want %d and 0", k, signal, got, ok, want)
			}
		}
	}
}

// A chain whose layer m does not run the middleware: multiplication starts
// again from that layer up, and never exceeds the chain without signals.
func TestSignalGapRestartsMultiplication(t *testing.T) {
	const k = 4
	for m := 1; m <= k; m++ {
		c := StartChain(ChainConfig{K: k,
			Transport: func(int) *retryhttp.Transport {
				return &retryhttp.Transport{Policy: quick, Budget: Unlimited()}
			},
			Signal: func(i int) bool { return i != m },
		})
		got, _ := c.Run(1)
		c.Close()
		// Layer m still honours the signal from below (one call), but says
		// nothing above: layer m-1 retries it, 3 calls of 3 bottom
		// attempts, and its own signal stops the layers above it. With no
		// layer above (m = 1), only the top-level caller is left, which
		// does not retry.
		want := int64(9)
		if m == 1 {
			want = 3
		}
		if got != want || got > 81 {
			t.Errorf("layer %d without the middleware: got %d attempts at the bottom; want %d (and never above 81)", m, got, want)
		}
	}
}

// The outage timeline of docs/budget.md, exact: the token bucket pays for
// 35 retries in a 60 s outage and then none; the ratio budget keeps paying
// for 10% of requests (plus 10 a second with the default minimum), so load
// stays at 1.1x (1.2x) of requests, outage or not.
func TestBudgetsThroughAnOutage(t *testing.T) {
	want := []struct {
		retries  int
		attempts int
	}{{35, 6035}, {1200, 7200}, {600, 6600}}
	for i, kind := range Budgets {
		s := BudgetRun(kind, OutageTimeline, 100, 1)
		out := Totals(s, 30, 90)
		if out.Retries != want[i].retries || out.Attempts != want[i].attempts || out.Requests != 6000 {
			t.Errorf("%s: got %d retries and %d attempts for %d requests in the outage; want %d, %d, 6000",
				kind.Name, out.Retries, out.Attempts, out.Requests, want[i].retries, want[i].attempts)
		}
	}
}
