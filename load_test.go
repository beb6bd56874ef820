package retryhttp

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// TestSharedTransportUnderLoad: 1,000 goroutines share one Transport against
// a loopback server that fails 30% of attempts. Every request gets a result,
// every write one key of its own, and the budget ends exactly where the
// attempt log says it must.
func TestSharedTransportUnderLoad(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		// Attempt i fails when (i*7) mod 10 < 3: 30%, spread evenly.
		if (n.Add(1)*7)%10 < 3 {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, r.Header.Get(DefaultIdempotencyHeader))
	}))
	defer srv.Close()

	// A bucket half full of 100,000 tokens: 1,000 requests can neither fill
	// it (at most +1,000) nor empty it (at most -28,000), so every refill
	// and every cost counts whole, and the final count follows exactly from
	// the attempt log. (Draining is TestSustainedOutage's subject.)
	budget := NewBudget(100_000)
	budget.take(50_000)
	var mu sync.Mutex
	var log []Attempt
	tr := &Transport{Budget: budget, Policy: Policy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
		OnAttempt: func(a Attempt) {
			if a.Tokens < 0 || a.Tokens > budget.Capacity() {
				t.Errorf("got %d tokens; want within [0, %d]", a.Tokens, budget.Capacity())
			}
			mu.Lock()
			log = append(log, a)
			mu.Unlock()
		}}
	client := &http.Client{Transport: tr}

	const workers = 1000
	keys := make([]string, workers)
	var wg sync.WaitGroup
	var results, fails atomic.Int64
	for i := range workers {
		wg.Go(func() {
			resp, err := client.Post(srv.URL, "text/plain", strings.NewReader(fmt.Sprint(i)))
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results.Add(1)
			if resp.StatusCode == 200 {
				keys[i] = string(b)
			} else {
				fails.Add(1)
			}
		})
	}
	wg.Wait()
	if results.Load() != workers {
		t.Fatalf("got %d results; want %d", results.Load(), workers)
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if k == "" {
			continue
		}
		if seen[k] {
			t.Errorf("key %s served two requests; want one key per request", k)
		}
		seen[k] = true
	}

	// Replay the log: +1 for a first-try success, -cost for a retry paid,
	// +cost back for the success that followed it.
	want := 50_000
	retries := 0
	for _, a := range log {
		switch {
		case a.Decision == Retry:
			c := RetryCost
			if a.Class == Throttling {
				c = ThrottleRetryCost
			}
			want -= c
			retries++
		case a.Class == Success && a.Number == 1:
			want++
		case a.Class == Success:
			want += prevCost(log, a)
		}
	}
	if got := budget.Available(); got != want {
		t.Errorf("got %d tokens at the end; want %d from the attempt log", got, want)
	}
	hist := map[string]int{}
	for _, a := range log {
		hist[a.Class.String()+"/"+a.Decision.String()]++
	}
	t.Logf("%d requests, %d attempts, %d retries, %d ended on 503, %d tokens left; %v", workers, len(log), retries, fails.Load(), budget.Available(), hist)
}

// prevCost finds the cost of the retry that led to success a: the Retry
// decision of the attempt before it with the same idempotency key.
func prevCost(log []Attempt, a Attempt) int {
	key := a.Request.Header.Get(DefaultIdempotencyHeader)
	for _, p := range log {
		if p.Number == a.Number-1 && p.Decision == Retry && p.Request.Header.Get(DefaultIdempotencyHeader) == key {
			if p.Class == Throttling {
				return ThrottleRetryCost
			}
			return RetryCost
		}
	}
	panic("no retry before a success after the first attempt")
}

func TestConnectionsReusedAcrossRetries(t *testing.T) {
	steps := []rht.Step{}
	for range 250 {
		steps = append(steps, rht.Status(503), rht.Status(200))
	}
	srv := rht.NewServer(t, steps...)
	tr := &Transport{Policy: fast, Budget: UnlimitedBudget()}
	for range 250 {
		code, _, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want (200, nil)", code, err)
		}
	}
	rht.AssertAttempts(t, srv, 500)
	if got := srv.Conns(); got != 1 {
		t.Errorf("got %d TCP connections for 500 attempts; want 1", got)
	}
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
		t.Logf("outage: %d requests, %d attempts (%.4f per request), %d tokens left", requests, outage, float64(outage)/requests, tr.BudgetInUse().Available())

		healthy.Store(true)
		healed := run(500) // 10 tokens + 490 rewards = the full 500
		if got := tr.BudgetInUse().Available(); got != 500 || healed != 500 {
			t.Errorf("healing: got %d attempts and %d tokens; want 500 and 500", healed, got)
		}
		healthy.Store(false)
		if got := run(1); got != 3 {
			t.Errorf("after healing: got %d attempts on a failure; want 3 (full retries back)", got)
		}
		t.Logf("after 500 successes: %d tokens, a new failure gets %d attempts again", 500, 3)
	})
}
