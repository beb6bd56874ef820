package herd

import (
	"time"

	"github.com/herdproof/retryhttp"
)

// ChainResult is one chain of SignalChains, a row of examples/herd -layers -json.
type ChainResult struct {
	Layers             int     `json:"layers"`
	Signal             bool    `json:"signal"`
	Bottom             string  `json:"bottom"`
	AttemptsPerRequest float64 `json:"bottom_attempts_per_request"`
	SuccessRate        float64 `json:"success_rate"`
	// MostAttempts is the most bottom attempts one request caused.
	MostAttempts int64 `json:"max_bottom_attempts"`
}

// MixedResult is a four-layer chain whose layer Without does not run the
// middleware, against a bottom that is down.
type MixedResult struct {
	Layers             int     `json:"layers"`
	Without            int     `json:"without_middleware"`
	AttemptsPerRequest float64 `json:"bottom_attempts_per_request"`
}

// SignalChains measures chains of 1 to 4 services, each retrying with 3
// attempts and no budget (so the budget does not hide the effect), with and
// without retryhttp.Handler, against a bottom that is down (10 requests;
// the figures are exact) or fails 30% of its attempts at random.
func SignalChains(flakyRequests int) ([]ChainResult, []MixedResult) {
	quick := retryhttp.Policy{BaseDelay: time.Microsecond, MaxDelay: time.Millisecond}
	transport := func(int) *retryhttp.Transport {
		return &retryhttp.Transport{Policy: quick, Budget: Unlimited()}
	}
	var chains []ChainResult
	for _, bottom := range []struct {
		name     string
		rate     float64
		requests int
	}{{"down", 1, 10}, {"flaky", 0.3, flakyRequests}} {
		for k := 1; k <= 4; k++ {
			for _, signal := range []bool{false, true} {
				c := StartChain(ChainConfig{K: k, Transport: transport,
					Signal: func(int) bool { return signal }, FailRate: bottom.rate, Seed: uint64(k)})
				attempts, ok, most := c.RunMax(bottom.requests)
				c.Close()
				chains = append(chains, ChainResult{Layers: k, Signal: signal, Bottom: bottom.name,
					AttemptsPerRequest: float64(attempts) / float64(bottom.requests),
					SuccessRate:        float64(ok) / float64(bottom.requests),
					MostAttempts:       most})
			}
		}
	}
	var mixed []MixedResult
	for m := 1; m <= 4; m++ {
		c := StartChain(ChainConfig{K: 4, Transport: transport, Signal: func(i int) bool { return i != m }})
		attempts, _ := c.Run(10)
		c.Close()
		mixed = append(mixed, MixedResult{Layers: 4, Without: m, AttemptsPerRequest: float64(attempts) / 10})
	}
	return chains, mixed
}
