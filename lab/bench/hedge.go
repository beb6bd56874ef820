package bench

import (
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/herdproof/retryhttp"
)

// HedgeConfig is the hedging comparison's workload.
type HedgeConfig struct {
	// TailRequests and SlowRequests are the requests of the two workloads.
	TailRequests, SlowRequests int
	// Workers send requests concurrently, each one after another.
	Workers int
	// Fast and Slow are the two latencies; SlowShare the share of slow
	// answers in the tail workload.
	Fast, Slow time.Duration
	SlowShare  float64
	// Delay is the hedge delay of both hedging implementations.
	Delay time.Duration
	// Seed seeds the server's draws.
	Seed uint64
}

// DefaultHedgeConfig is the workload of docs/benchmarks.md: 95% of answers
// in 2 ms and 5% in 200 ms, hedged after 10 ms.
var DefaultHedgeConfig = HedgeConfig{TailRequests: 4000, SlowRequests: 600, Workers: 8,
	Fast: 2 * time.Millisecond, Slow: 200 * time.Millisecond, SlowShare: 0.05, Delay: 10 * time.Millisecond, Seed: 1}

// HedgeRun is one implementation on one workload.
type HedgeRun struct {
	Name     string  `json:"name"`
	Workload string  `json:"workload"`
	P50      float64 `json:"p50_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
	// RequestsPerRequest is what the server received per request made.
	RequestsPerRequest float64 `json:"requests_per_request"`
	// SteadyRequestsPerRequest is the same over the second half of the
	// requests, once a budget has had time to react.
	SteadyRequestsPerRequest float64 `json:"steady_requests_per_request"`
}

// hedgeImpl makes one implementation's RoundTripper over base.
type hedgeImpl struct {
	name string
	new  func(base http.RoundTripper, delay time.Duration) http.RoundTripper
}

var hedgeImpls = []hedgeImpl{
	{"none", func(base http.RoundTripper, _ time.Duration) http.RoundTripper {
		return &retryhttp.Transport{Base: base}
	}},
	{"retryhttp", func(base http.RoundTripper, d time.Duration) http.RoundTripper {
		return &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{HedgeDelay: d}}
	}},
	{"failsafe", func(base http.RoundTripper, d time.Duration) http.RoundTripper {
		return failsafehttp.NewRoundTripper(base, hedgepolicy.NewWithDelay[*http.Response](d))
	}},
}

// HedgeComparison runs every implementation on both workloads, over real
// loopback connections: "tail" (SlowShare of the answers slow) and
// "slow-all" (every answer slow).
func HedgeComparison(cfg HedgeConfig) []HedgeRun {
	var runs []HedgeRun
	for _, w := range []struct {
		name     string
		share    float64
		requests int
	}{{"tail", cfg.SlowShare, cfg.TailRequests}, {"slow-all", 1, cfg.SlowRequests}} {
		for _, impl := range hedgeImpls {
			run := hedgeOnce(cfg, impl, w.share, w.requests)
			run.Workload = w.name
			runs = append(runs, run)
		}
	}
	return runs
}

func hedgeOnce(cfg HedgeConfig, impl hedgeImpl, slowShare float64, requests int) HedgeRun {
	var (
		mu       sync.Mutex
		rng      = rand.New(rand.NewPCG(cfg.Seed, 11))
		received atomic.Int64
		copies   = make([]int, requests) // what the server received for each request
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		received.Add(1)
		i, _ := strconv.Atoi(r.Header.Get("X-Request-Index")) // hedges copy the header
		mu.Lock()
		slow := rng.Float64() < slowShare
		if i >= 0 && i < len(copies) {
			copies[i]++
		}
		mu.Unlock()
		d := cfg.Fast
		if slow {
			d = cfg.Slow
		}
		select {
		case <-time.After(d):
			io.WriteString(w, "ok")
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 4 * cfg.Workers}
	defer base.CloseIdleConnections()
	rt := impl.new(base, cfg.Delay)

	latencies := make([]time.Duration, requests)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range cfg.Workers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(requests) {
					return
				}
				req, _ := http.NewRequest("GET", srv.URL, nil)
				req.Header.Set("X-Request-Index", strconv.FormatInt(i, 10))
				start := time.Now()
				resp, err := rt.RoundTrip(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				latencies[i] = time.Since(start)
			}
		})
	}
	wg.Wait()
	slices.Sort(latencies)
	q := func(p float64) float64 {
		return float64(latencies[min(len(latencies)-1, int(p*float64(len(latencies))))]) / float64(time.Millisecond)
	}
	// Canceled copies may still be arriving: Close waits for every handler.
	srv.Close()
	mu.Lock()
	steady := 0
	for _, n := range copies[requests/2:] {
		steady += n
	}
	mu.Unlock()
	return HedgeRun{Name: impl.name, P50: q(0.50), P99: q(0.99), P999: q(0.999),
		RequestsPerRequest:       float64(received.Load()) / float64(requests),
		SteadyRequestsPerRequest: float64(steady) / float64(requests-requests/2)}
}
