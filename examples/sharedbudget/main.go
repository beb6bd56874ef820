// Command sharedbudget shows two clients of one dependency sharing one
// retry budget: when the dependency goes down, their retries together stop
// after the shared tokens are spent, instead of each client spending its
// own. It starts its own local server; no network needed.
//
//	go run ./examples/sharedbudget
package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
)

func main() {
	var attempts atomic.Int64
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		attempts.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer down.Close()

	fast := retryhttp.Policy{BaseDelay: time.Millisecond}
	run := func(label string, a, b *retryhttp.Transport) {
		attempts.Store(0)
		for i := range 100 {
			tr := a
			if i%2 == 1 {
				tr = b
			}
			resp, err := (&http.Client{Transport: tr}).Get(down.URL)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
		fmt.Printf("%-28s 100 requests, %d attempts reached the dependency\n", label, attempts.Load())
	}

	// Each Transport with its own 500 tokens: twice the retries.
	run("a budget each:", &retryhttp.Transport{Policy: fast}, &retryhttp.Transport{Policy: fast})

	// One Budget for both: the dependency sees one quota's worth.
	shared := retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens)
	run("one shared budget:", &retryhttp.Transport{Policy: fast, Budget: shared}, &retryhttp.Transport{Policy: fast, Budget: shared})
	fmt.Printf("shared budget left: %d of %d tokens\n", shared.Available(), retryhttp.DefaultBudgetTokens)
}
