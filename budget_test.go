package retryhttp

import (
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

func TestBudgetTakeAndGive(t *testing.T) {
	b := newTokenBucket(30)
	steps := []struct {
		op   string
		n    int64
		ok   bool
		want int
	}{
		{"take", 14, true, 16},
		{"take", 14, true, 2},
		{"take", 5, false, 2},
		{"give", 14, true, 16},
		{"give", 100, true, 30},
		{"take", 30, true, 0},
		{"take", 1, false, 0},
	}
	for i, s := range steps {
		ok := true
		if s.op == "take" {
			ok = b.take(s.n)
		} else {
			b.give(s.n)
		}
		if ok != s.ok || b.Available() != s.want {
			t.Errorf("step %d (%s %d): got (%v, %d); want (%v, %d)", i, s.op, s.n, ok, b.Available(), s.ok, s.want)
		}
	}
}

func TestBudgetEdges(t *testing.T) {
	if got := newTokenBucket(-3).size(); got != 0 {
		t.Errorf("newTokenBucket(-3): got capacity %d; want 0", got)
	}
	var zero tokenBucket
	if zero.take(1) {
		t.Error("the zero bucket paid for a retry; want refusal")
	}
}

func TestBudgetNearMaxIntNeverOverflows(t *testing.T) {
	// A capacity near math.MaxInt64 ("practically unlimited"): a refund
	// landing after a deposit topped the bucket up must not wrap it
	// negative, which would refuse every retry after.
	b := newTokenBucket(math.MaxInt)
	paid, ok := b.Withdraw(ctxBG, Transient)
	if !ok {
		t.Fatal("a full bucket refused a retry")
	}
	b.Deposit(true)
	paid(true)
	if got := b.Available(); got != b.size() {
		t.Errorf("got %d tokens; want the capacity, %d", got, b.size())
	}
	if _, ok := b.Withdraw(ctxBG, Transient); !ok {
		t.Errorf("got a refusal with %d tokens; want a retry paid", b.Available())
	}
}

func TestBudgetConcurrent(t *testing.T) {
	b := newTokenBucket(500)
	var wg sync.WaitGroup
	var paid atomic.Int64

	// 64 goroutines race to pay for retries: exactly floor(500/14) = 35 win.
	for range 64 {
		wg.Go(func() {
			for b.take(RetryCost) {
				paid.Add(1)
			}
		})
	}
	wg.Wait()
	if got := paid.Load(); got != 35 {
		t.Errorf("got %d retries paid; want 35", got)
	}
	if got := b.Available(); got != 500-35*RetryCost {
		t.Errorf("got %d tokens; want %d", got, 500-35*RetryCost)
	}

	// 1,000 concurrent rewards fill it exactly to capacity, not beyond.
	for range 1000 {
		wg.Go(func() { b.give(successReward) })
	}
	wg.Wait()
	if got := b.Available(); got != 500 {
		t.Errorf("got %d tokens; want 500", got)
	}

	// Mixed traffic never leaves [0, capacity].
	for g := range 64 {
		wg.Go(func() {
			for i := range 2000 {
				if (g+i)%3 == 0 {
					b.give(successReward)
				} else if b.take(RetryCost) && i%2 == 0 {
					b.give(RetryCost) // a refunded retry
				}
				if a := b.Available(); a < 0 || a > 500 {
					t.Errorf("got %d tokens; want within [0, 500]", a)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestSustainedOutage: 10,000 requests against a dependency that answers
// only 503, through one Transport with default settings. Once the 500 tokens
// are spent, each request costs one attempt; after the dependency heals,
// successes refill the bucket and full retries come back.
func TestSustainedOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var healthy atomic.Bool
		var attempts atomic.Int64
		base := roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			attempts.Add(1)
			code := 503
			if healthy.Load() {
				code = 200
			}
			return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
		})
		tr := &Transport{Base: base}
		run := func(n int) int64 {
			before := attempts.Load()
			for range n {
				roundTrip(t, tr, newReq(t, "GET", ""))
			}
			return attempts.Load() - before
		}

		const requests = 10_000
		outage := run(requests)
		// 500 tokens pay for floor(500/14) = 35 retries; every request
		// makes its first attempt.
		if want := int64(requests + 35); outage != want {
			t.Errorf("outage: got %d attempts; want %d", outage, want)
		}
		if ratio := float64(outage) / requests; ratio >= 1.05 {
			t.Errorf("outage: got %.4f attempts per request; want under 1.05", ratio)
		}
		t.Logf("outage: %d requests, %d attempts (%.4f per request), %d tokens left", requests, outage, float64(outage)/requests, tr.budgetInUse().Available())

		healthy.Store(true)
		healed := run(500) // 10 tokens + 490 rewards = the full 500
		if got := tr.budgetInUse().Available(); got != 500 || healed != 500 {
			t.Errorf("healing: got %d attempts and %d tokens; want 500 and 500", healed, got)
		}
		healthy.Store(false)
		if got := run(1); got != 3 {
			t.Errorf("after healing: got %d attempts on a failure; want 3 (full retries back)", got)
		}
		t.Logf("after 500 successes: %d tokens, a new failure gets %d attempts again", 500, 3)
	})
}
