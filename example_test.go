package retryhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
)

// flaky starts a local server that answers 503 to its first `failures`
// requests and "hello" after that.
func flaky(failures int32) (*httptest.Server, *atomic.Int32) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) <= failures {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "hello")
	}))
	return srv, &calls
}

// A zero Transport is a drop-in for any http.Client: three attempts, full
// jitter, a 500-token budget.
func Example() {
	srv, calls := flaky(2)
	defer srv.Close()

	client := &http.Client{Transport: &retryhttp.Transport{}}
	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "after", calls.Load(), "attempts")
	// Output: 200 hello after 3 attempts
}

// OnAttempt sees every attempt and the decision taken after it.
func ExampleTransport_onAttempt() {
	srv, _ := flaky(2)
	defer srv.Close()

	budget := retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens)
	ceiling := func(n int64) int64 { return n - 1 } // each wait at the top of its window
	tr := &retryhttp.Transport{
		Budget: budget,
		Policy: retryhttp.Policy{Rand: ceiling, BaseDelay: 10 * time.Millisecond},
		OnAttempt: func(a retryhttp.Attempt) {
			fmt.Printf("attempt %d: %d %v -> %v %v (tokens %d)\n",
				a.Number, a.Status, a.Class, a.Decision, a.Delay, budget.Available())
		},
	}
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err == nil {
		resp.Body.Close()
	}
	// Output:
	// attempt 1: 503 transient -> retry 10ms (tokens 486)
	// attempt 2: 503 transient -> retry 20ms (tokens 472)
	// attempt 3: 200 success -> done 0s (tokens 486)
}

// OnEnd sees every request end once, also one that ends in the wait for a
// retry, which no attempt's hook shows: here the caller gives up while the
// retry waits for the server's Retry-After.
func ExampleTransport_onEnd() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tr := &retryhttp.Transport{
		OnAttempt: func(a retryhttp.Attempt) {
			fmt.Printf("attempt %d: %d -> %v\n", a.Number, a.Status, a.Decision)
			cancel() // the caller gives up
		},
		OnEnd: func(_ *http.Request, r retryhttp.Report) {
			fmt.Printf("end: %v after %d attempt(s), abandoned %v\n", r.Decision, r.Attempts, r.Abandoned)
		},
	}
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	// Output:
	// attempt 1: 503 -> retry
	// end: canceled after 1 attempt(s), abandoned true
}

// Transports that share a Budget share one quota: when one dependency is
// down, retries stop for every client drawing from it.
func ExampleBudget_shared() {
	srv, _ := flaky(1 << 30) // down for good
	defer srv.Close()

	budget := retryhttp.NewTokenBucket(30)
	fast := retryhttp.Policy{BaseDelay: time.Millisecond}
	a := &http.Client{Transport: &retryhttp.Transport{Budget: budget, Policy: fast}}
	b := &http.Client{Transport: &retryhttp.Transport{Budget: budget, Policy: fast}}

	for _, c := range []*http.Client{a, b, a} {
		resp, err := c.Get(srv.URL)
		if err == nil {
			resp.Body.Close()
		}
		fmt.Println(resp.StatusCode, "tokens left:", budget.Available())
	}
	// Output:
	// 503 tokens left: 2
	// 503 tokens left: 2
	// 503 tokens left: 2
}

// A classifier that also retries 500 and 408, for a dependency whose
// contract says those are safe to repeat.
func ExamplePolicy_classify() {
	p := retryhttp.Policy{
		Classify: func(resp *http.Response, err error) retryhttp.Class {
			if resp != nil && (resp.StatusCode == 500 || resp.StatusCode == 408) {
				return retryhttp.Transient
			}
			return retryhttp.DefaultClassify(resp, err)
		},
	}
	for _, code := range []int{200, 404, 408, 429, 500, 503} {
		fmt.Println(code, p.Classify(&http.Response{StatusCode: code}, nil))
	}
	// Output:
	// 200 success
	// 404 permanent
	// 408 transient
	// 429 throttling
	// 500 transient
	// 503 transient
}

// A Report says what happened to one request, also when a response came
// back with a nil error: here the budget (one retry's worth of tokens) cut
// retrying short, and the caller still got the server's 503.
func ExampleWithReport() {
	srv, _ := flaky(1000) // down
	defer srv.Close()

	tr := &retryhttp.Transport{
		Budget: retryhttp.NewTokenBucket(retryhttp.RetryCost),
		Policy: retryhttp.Policy{BaseDelay: 10 * time.Millisecond},
	}
	req, _ := http.NewRequest("GET", srv.URL, nil)
	var rep retryhttp.Report
	req = req.WithContext(retryhttp.WithReport(req.Context(), &rep))
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("status", resp.StatusCode, "error", err)
	for _, a := range rep.History {
		fmt.Printf("attempt %d: %d -> %v\n", a.Number, a.Status, a.Decision)
	}
	fmt.Println("stopped:", rep.Decision, "after", rep.Attempts, "attempts")
	// Output:
	// status 503 error <nil>
	// attempt 1: 503 -> retry
	// attempt 2: 503 -> retry budget exhausted
	// stopped: retry budget exhausted after 2 attempts
}

// Two services in a chain, each retrying with 3 attempts, each wrapped in
// Handler. The bottom is down: the service next to it retries it (3
// attempts), then answers 503 with Retries-Exhausted, and the gateway above
// passes that 503 on at once instead of retrying it (which would have made
// 9 attempts at the bottom).
func ExampleHandler() {
	var bottomCalls atomic.Int32
	bottom := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bottomCalls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer bottom.Close()

	// service calls next with the inbound request's context.
	service := func(next string) *httptest.Server {
		client := &http.Client{Transport: &retryhttp.Transport{Policy: retryhttp.Policy{BaseDelay: time.Millisecond}}}
		return httptest.NewServer(retryhttp.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := http.NewRequestWithContext(r.Context(), "GET", next, nil)
			resp, err := client.Do(req)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
		})))
	}
	inventory := service(bottom.URL)
	defer inventory.Close()
	gateway := service(inventory.URL)
	defer gateway.Close()

	resp, err := http.Get(gateway.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Header.Get("Retries-Exhausted"), "after", bottomCalls.Load(), "attempts at the bottom")
	// Output: 503 downstream after 3 attempts at the bottom
}

// A RateLimiter slows a client that is being throttled: after a 429, every
// attempt waits for a send permit, and a request whose permit cannot come
// before its deadline fails at once instead of adding to the 429s.
func ExampleRateLimiter() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/busy" {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	lim := &retryhttp.RateLimiter{} // share it between the Transports that call this server
	client := &http.Client{Transport: &retryhttp.Transport{Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}}

	start := time.Now()
	resp, _ := client.Get(srv.URL + "/busy")
	resp.Body.Close()
	fmt.Printf("%d; limiting at %.1f requests/s\n", resp.StatusCode, lim.Stats().Rate)

	// One send so far: metered over at least 100 ms, 10/s; the first cut
	// keeps a quarter. The next permit is 400 ms after the 429: a 20 ms
	// deadline is too close.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	_, err := client.Do(req)
	fmt.Println(errors.Is(err, retryhttp.ErrRateLimited))

	resp, err = client.Get(srv.URL) // no deadline: waits for the permit
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, time.Since(start) >= 400*time.Millisecond)
	// Output:
	// 429; limiting at 2.5 requests/s
	// true
	// 200 true
}

// One client, many hosts: each destination gets a budget of its own, so a
// dead host spends only its own retries. Here the dead one drains its
// bucket, and the healthy one's failure is still retried.
func ExamplePerHost() {
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer dead.Close()
	healthy, _ := flaky(1)
	defer healthy.Close()

	budgets := map[string]retryhttp.Budget{} // by destination, to read them
	hosts := &retryhttp.PerHost{Budget: func(dest string) retryhttp.Budget {
		budgets[dest] = retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens)
		return budgets[dest]
	}}
	client := &http.Client{Transport: &retryhttp.Transport{
		PerHost: hosts,
		Policy:  retryhttp.Policy{BaseDelay: time.Millisecond},
	}}
	for range 20 {
		if resp, err := client.Get(dead.URL); err == nil {
			resp.Body.Close()
		}
	}
	resp, err := client.Get(healthy.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println("healthy host:", resp.StatusCode)
	fmt.Println("dead host's tokens left:", budgets[dead.URL].Available())
	fmt.Println("destinations:", len(budgets))
	// Output:
	// healthy host: 200
	// dead host's tokens left: 10
	// destinations: 2
}

// A request that must not be retried, through a client that retries the
// rest: the Override rides on the request's context.
func ExampleWithOverride() {
	srv, calls := flaky(1)
	defer srv.Close()
	client := &http.Client{Transport: &retryhttp.Transport{}}

	ctx := retryhttp.WithOverride(context.Background(), retryhttp.Override{MaxAttempts: 1})
	req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "after", calls.Load(), "attempt")
	// Output: 503 after 1 attempt
}
