package herd

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"

	"github.com/herdproof/retryhttp"
)

// Chain is k services on loopback, each calling the next through its own
// Transport, in front of a bottom service that always answers 503. Service 1
// is the entry point; each service answers with the status it got from
// below, so a failure propagates up the chain.
type Chain struct {
	// URL is service 1's address.
	URL string
	// Transports are the services' Transports, service 1's first.
	Transports []*retryhttp.Transport

	bottom   atomic.Int64
	servers  []*httptest.Server
	bottomTS *httptest.Server
}

// NewChain starts a chain of k services; transport(i) makes the Transport of
// service i (1 to k), through which it calls service i+1 (the bottom, for
// i = k). Close it when done.
func NewChain(k int, transport func(i int) *retryhttp.Transport) *Chain {
	c := &Chain{}
	c.bottomTS = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.bottom.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	next := c.bottomTS.URL
	c.Transports = make([]*retryhttp.Transport, k)
	for i := k; i >= 1; i-- {
		tr := transport(i)
		c.Transports[i-1] = tr
		client := &http.Client{Transport: tr}
		target := next
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			resp, err := client.Get(target)
			if err != nil {
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			w.WriteHeader(resp.StatusCode)
		}))
		c.servers = append(c.servers, srv)
		next = srv.URL
	}
	c.URL = next
	return c
}

// BottomAttempts reports how many requests reached the bottom service.
func (c *Chain) BottomAttempts() int64 { return c.bottom.Load() }

// Call makes n top-level requests, one after another, with a client that
// does not retry, and returns how many attempts reached the bottom.
func (c *Chain) Call(n int) int64 {
	before := c.BottomAttempts()
	for range n {
		resp, err := http.Get(c.URL)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}
	return c.BottomAttempts() - before
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
