package herd

import (
	"math/rand/v2"
	"net/http"
	"sync"

	"github.com/herdproof/retryhttp"
)

// Drift is the expected change of the retry budget per request when each of
// up to three attempts fails independently with probability p and a retry
// costs c tokens: +1 for a first-try success, 0 when the first retry
// succeeds (its cost is refunded), -c when the second one does, -2c when all
// three attempts fail:
//
//	E(p) = (1-p) - c·p²·(1-p) - 2c·p³
func Drift(p float64, c int) float64 {
	cf := float64(c)
	return (1 - p) - cf*p*p*(1-p) - 2*cf*p*p*p
}

// BreakEven returns p*, the failure probability at which Drift is zero:
// below it successes refill the bucket faster than failures drain it. E is
// decreasing on [0, 1] (from +1 to -2c), so bisection finds the one root.
func BreakEven(c int) float64 {
	lo, hi := 0.0, 1.0
	for range 100 {
		mid := (lo + hi) / 2
		if Drift(mid, c) > 0 {
			lo = mid
		} else {
			hi = mid
		}
	}
	return (lo + hi) / 2
}

// QuotaPoint is what driving the real Transport and Budget measured at one
// failure probability.
type QuotaPoint struct {
	P        float64 // probability that an attempt fails
	Requests int
	Retries  int // retries made (paid for)
	Refused  int // retries the budget refused
	MinLeft  int // the fewest tokens seen after a decision
}

// RefusedShare is the share of wanted retries that the budget refused.
func (q QuotaPoint) RefusedShare() float64 {
	if q.Retries+q.Refused == 0 {
		return 0
	}
	return float64(q.Refused) / float64(q.Retries+q.Refused)
}

// DriveQuota sends requests one after another through a Transport with the
// given policy and a fresh 500-token Budget, whose base fails each attempt
// with probability p, answering status (503: transient, 429: throttling) or
// 200. The Transport waits for real: inside a testing/synctest bubble its
// backoff takes no time. Outside one, a policy whose Rand returns 0 makes
// every wait zero; with one request at a time, the waits change nothing in
// the budget's accounting.
func DriveQuota(policy retryhttp.Policy, p float64, status, requests int, seed uint64) QuotaPoint {
	rng := rand.New(rand.NewPCG(seed, 1))
	var mu sync.Mutex
	base := roundTripper(func(req *http.Request) (*http.Response, error) {
		mu.Lock()
		fail := rng.Float64() < p
		mu.Unlock()
		code := http.StatusOK
		if fail {
			code = status
		}
		return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
	})
	q := QuotaPoint{P: p, Requests: requests, MinLeft: retryhttp.DefaultBudgetTokens}
	budget := retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens) // what a nil Budget means
	tr := &retryhttp.Transport{Base: base, Policy: policy, Budget: budget, OnAttempt: func(a retryhttp.Attempt) {
		switch a.Decision {
		case retryhttp.Retry:
			q.Retries++
		case retryhttp.StopBudget:
			q.Refused++
		}
		q.MinLeft = min(q.MinLeft, budget.Available())
	}}
	req, _ := http.NewRequest("GET", "http://quota.test/", nil)
	for range requests {
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	return q
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
