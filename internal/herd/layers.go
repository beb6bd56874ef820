package herd

import (
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"

	"github.com/herdproof/retryhttp"
)

// Chain is k services on loopback, each calling the next through its own
// Transport, in front of a bottom service that answers 503 to all or a share
// of its requests. Service 1 is the entry point; each service calls the next
// with its inbound request's context and answers with the status it got
// from below (502 after an error), so a failure propagates up the chain.
type Chain struct {
	// URL is service 1's address.
	URL string
	// Transports are the services' Transports, service 1's first.
	Transports []*retryhttp.Transport

	bottom   atomic.Int64
	servers  []*httptest.Server
	bottomTS *httptest.Server
	mu       sync.Mutex
	rnd      *rand.Rand
}

// ChainConfig describes a chain.
type ChainConfig struct {
	// K is the number of services above the bottom one.
	K int
	// Transport makes the Transport of service i (1 to K), through which it
	// calls service i+1 (the bottom, for i = K).
	Transport func(i int) *retryhttp.Transport
	// Signal reports whether service i runs under retryhttp.Handler, which
	// tells the layer above not to retry what it already retried. Nil means
	// none does.
	Signal func(i int) bool
	// FailRate is the share of requests the bottom answers with 503, drawn
	// at random; 0 or 1 means all of them (the bottom is down).
	FailRate float64
	// Seed seeds the bottom's draws.
	Seed uint64
}

// NewChain starts a chain of k services in front of a bottom that is down;
// transport(i) makes the Transport of service i. Close it when done.
func NewChain(k int, transport func(i int) *retryhttp.Transport) *Chain {
	return StartChain(ChainConfig{K: k, Transport: transport})
}

// StartChain starts the chain cfg describes. Close it when done.
func StartChain(cfg ChainConfig) *Chain {
	c := &Chain{rnd: rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))}
	c.bottomTS = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.bottom.Add(1)
		if c.fails(cfg.FailRate) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	next := c.bottomTS.URL
	c.Transports = make([]*retryhttp.Transport, cfg.K)
	for i := cfg.K; i >= 1; i-- {
		tr := cfg.Transport(i)
		c.Transports[i-1] = tr
		target := next
		var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			req, _ := http.NewRequestWithContext(r.Context(), "GET", target, nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
		})
		if cfg.Signal != nil && cfg.Signal(i) {
			h = retryhttp.Handler(h)
		}
		srv := httptest.NewServer(h)
		c.servers = append(c.servers, srv)
		next = srv.URL
	}
	c.URL = next
	return c
}

func (c *Chain) fails(rate float64) bool {
	if rate <= 0 || rate >= 1 {
		return true
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.rnd.Float64() < rate
}

// BottomAttempts reports how many requests reached the bottom service.
func (c *Chain) BottomAttempts() int64 { return c.bottom.Load() }

// Call makes n top-level requests, one after another, with a client that
// does not retry, and returns how many attempts reached the bottom.
func (c *Chain) Call(n int) int64 {
	attempts, _ := c.Run(n)
	return attempts
}

// Run makes n top-level requests, one after another, with a client that
// does not retry, and returns how many attempts reached the bottom and how
// many requests succeeded (2xx).
func (c *Chain) Run(n int) (attempts int64, ok int) {
	attempts, ok, _ = c.RunMax(n)
	return attempts, ok
}

// RunMax is Run that also returns the most attempts one request caused at
// the bottom.
func (c *Chain) RunMax(n int) (attempts int64, ok int, most int64) {
	before := c.BottomAttempts()
	for range n {
		start := c.BottomAttempts()
		resp, err := http.Get(c.URL)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 300 {
				ok++
			}
		}
		most = max(most, c.BottomAttempts()-start)
	}
	return c.BottomAttempts() - before, ok, most
}

// Close stops every service and closes the Transports' idle connections.
func (c *Chain) Close() {
	for _, s := range c.servers {
		s.Close()
	}
	c.bottomTS.Close()
	for _, tr := range c.Transports {
		tr.CloseIdleConnections()
	}
	http.DefaultClient.CloseIdleConnections()
}
