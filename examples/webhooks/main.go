// Command webhooks shows why a client that talks to many hosts needs a
// retry budget and a rate limiter per destination. A webhook sender
// delivers events to about a thousand endpoints over real loopback
// connections: most are healthy but fail a tenth of attempts at random,
// some are down, a few throttle everything. It delivers the same events
// twice: once with one budget and one RateLimiter for every destination,
// once with retryhttp.PerHost, and prints what each did to the healthy and
// to the sick endpoints. It starts its own local server; no network needed.
//
//	go run ./examples/webhooks          # a table and what it shows
//	go run ./examples/webhooks -json    # the same, as JSON
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-cleanhttp"
	"github.com/herdproof/retryhttp"
)

type config struct {
	destinations int
	perDest      int     // deliveries to each destination
	down         float64 // share of destinations that answer only 503
	throttling   float64 // share that answer only 429 with Retry-After
	flaky        float64 // share of a healthy destination's attempts that fail with 503
	workers      int
	timeout      time.Duration // per delivery
	seed         uint64
}

// Result is one run, as -json prints it.
type Result struct {
	Name                    string  `json:"name"`
	HealthySuccessRate      float64 `json:"healthy_success_rate"`
	HealthyRetriesRefused   int     `json:"healthy_retries_refused"`
	SickAttemptsPerRequest  float64 `json:"sick_attempts_per_request"`
	HeapBytesPerDestination float64 `json:"heap_bytes_per_destination"`
	Seconds                 float64 `json:"seconds"`
}

// Output is what -json prints.
type Output struct {
	Destinations int      `json:"destinations"`
	Down         int      `json:"down"`
	Throttling   int      `json:"throttling"`
	Requests     int      `json:"requests"`
	Runs         []Result `json:"runs"`
}

func main() {
	cfg := config{}
	flag.IntVar(&cfg.destinations, "destinations", 1000, "webhook endpoints")
	flag.IntVar(&cfg.perDest, "requests", 200, "deliveries to each endpoint")
	flag.Float64Var(&cfg.down, "down", 0.05, "share of endpoints that are down (503)")
	flag.Float64Var(&cfg.throttling, "throttling", 0.01, "share of endpoints that throttle everything (429, Retry-After: 1)")
	flag.Float64Var(&cfg.flaky, "flaky", 0.1, "share of a healthy endpoint's attempts that fail (503)")
	flag.IntVar(&cfg.workers, "workers", 512, "deliveries in flight")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Second, "deadline of one delivery")
	flag.Uint64Var(&cfg.seed, "seed", 1, "random seed")
	asJSON := flag.Bool("json", false, "print JSON")
	flag.Parse()

	out := run(cfg, os.Stderr)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			log.Fatal(err)
		}
		return
	}
	printTable(os.Stdout, out)
}

// kind of a destination.
type kind int

const (
	healthy kind = iota
	down
	throttling
)

// fleet is the endpoints: one loopback server that answers for every
// destination name according to its kind, and counts attempts.
type fleet struct {
	srv      *httptest.Server
	kinds    []kind
	attempts []atomic.Int64
	flaky    float64
	seed     uint64
}

func newFleet(cfg config) *fleet {
	f := &fleet{kinds: make([]kind, cfg.destinations), attempts: make([]atomic.Int64, cfg.destinations), flaky: cfg.flaky, seed: cfg.seed}
	nDown, nThrottling := share(cfg.destinations, cfg.down), share(cfg.destinations, cfg.throttling)
	for i := range f.kinds {
		switch {
		case i < nDown:
			f.kinds[i] = down
		case i < nDown+nThrottling:
			f.kinds[i] = throttling
		}
	}
	var n atomic.Uint64
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		d, err := strconv.Atoi(strings.TrimPrefix(strings.Split(r.Host, ".")[0], "d"))
		if err != nil || d >= len(f.kinds) {
			http.Error(w, "no such endpoint", http.StatusNotFound)
			return
		}
		f.attempts[d].Add(1)
		switch f.kinds[d] {
		case down:
			w.WriteHeader(http.StatusServiceUnavailable)
		case throttling:
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		default:
			// A fixed pseudo-random sequence, so both runs see the same
			// share of failures.
			if rand.New(rand.NewPCG(f.seed, n.Add(1))).Float64() < f.flaky {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, "ok")
		}
	}))
	f.srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	return f
}

// share is the number of n destinations that a share of them makes, at
// least one when the share is not zero.
func share(n int, s float64) int {
	if s <= 0 {
		return 0
	}
	return max(1, int(float64(n)*s+0.5))
}

// base is an http.Transport that sends every destination name to the
// fleet's loopback server, over connections of their own per name.
func (f *fleet) base() *http.Transport {
	tr := cleanhttp.DefaultPooledTransport()
	addr := f.srv.Listener.Addr().String()
	var d net.Dialer
	tr.DialContext = func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, addr)
	}
	tr.MaxIdleConnsPerHost = 2
	tr.MaxIdleConns = 0 // no limit across hosts: a thousand endpoints keep their connections
	return tr
}

func url(d int) string { return fmt.Sprintf("http://d%d.webhooks.test/hook", d) }

// setup is how a run's Transport is made.
type setup struct {
	name string
	make func(base http.RoundTripper) *retryhttp.Transport
}

var setups = []setup{
	{"shared", func(base http.RoundTripper) *retryhttp.Transport {
		return &retryhttp.Transport{Base: base, Limiter: &retryhttp.RateLimiter{}}
	}},
	{"per-host", func(base http.RoundTripper) *retryhttp.Transport {
		return &retryhttp.Transport{Base: base, PerHost: &retryhttp.PerHost{
			Limiter: func(string) *retryhttp.RateLimiter { return &retryhttp.RateLimiter{} },
		}}
	}},
}

func run(cfg config, progress io.Writer) Output {
	out := Output{Destinations: cfg.destinations, Requests: cfg.destinations * cfg.perDest}
	for _, s := range setups {
		f := newFleet(cfg)
		if out.Down == 0 {
			for _, k := range f.kinds {
				switch k {
				case down:
					out.Down++
				case throttling:
					out.Throttling++
				}
			}
		}
		if progress != nil {
			fmt.Fprintf(progress, "%s: %d deliveries to %d endpoints...\n", s.name, out.Requests, cfg.destinations)
		}
		heap := heapPerDestination(cfg, s) // before the run leaves garbage behind
		r := deliver(cfg, f, s, progress)
		r.HeapBytesPerDestination = heap
		f.srv.Close()
		out.Runs = append(out.Runs, r)
	}
	return out
}

// deliver sends every event once, in a shuffled order, and measures. It
// writes its progress to progress, if not nil.
func deliver(cfg config, f *fleet, s setup, progress io.Writer) Result {
	base := f.base()
	defer base.CloseIdleConnections()
	tr := s.make(base)
	client := &http.Client{Transport: tr}

	order := make([]int, 0, cfg.destinations*cfg.perDest)
	for d := range cfg.destinations {
		for range cfg.perDest {
			order = append(order, d)
		}
	}
	rnd := rand.New(rand.NewPCG(cfg.seed, 2))
	rnd.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })

	var (
		next                    atomic.Int64
		healthyOK, healthyTotal atomic.Int64
		refused                 atomic.Int64
		sickRequests            atomic.Int64
		wg                      sync.WaitGroup
	)
	start := time.Now()
	if progress != nil {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			tick := time.NewTicker(5 * time.Second)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					fmt.Fprintf(progress, "  %s: %d of %d delivered\n", s.name, min(next.Load(), int64(len(order))), len(order))
				}
			}
		}()
	}
	for range cfg.workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= len(order) {
					return
				}
				d := order[i]
				var rep retryhttp.Report
				ctx, cancel := context.WithTimeout(retryhttp.WithReport(context.Background(), &rep), cfg.timeout)
				req, _ := http.NewRequestWithContext(ctx, "POST", url(d), strings.NewReader(`{"event":"order.paid"}`))
				resp, err := client.Do(req)
				ok := err == nil && resp.StatusCode == http.StatusOK
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
				if f.kinds[d] != healthy {
					sickRequests.Add(1)
					continue
				}
				healthyTotal.Add(1)
				if ok {
					healthyOK.Add(1)
				}
				if rep.Decision == retryhttp.StopBudget || rep.Decision == retryhttp.StopRateLimited {
					refused.Add(1)
				}
			}
		})
	}
	wg.Wait()
	var sickAttempts int64
	for d, k := range f.kinds {
		if k != healthy {
			sickAttempts += f.attempts[d].Load()
		}
	}
	r := Result{
		Name:                  s.name,
		HealthySuccessRate:    float64(healthyOK.Load()) / float64(max(healthyTotal.Load(), 1)),
		HealthyRetriesRefused: int(refused.Load()),
		Seconds:               time.Since(start).Seconds(),
	}
	if n := sickRequests.Load(); n > 0 {
		r.SickAttemptsPerRequest = float64(sickAttempts) / float64(n)
	}
	return r
}

// heapPerDestination measures what the setup keeps per destination it has
// seen: the heap after one request to each destination, through an
// in-memory base so that no connection is counted, less the heap before.
func heapPerDestination(cfg config, s setup) float64 {
	ok := roundTripper(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC() // sync.Pools keep what they drop for one more cycle
	runtime.ReadMemStats(&before)
	tr := s.make(ok)
	for d := range cfg.destinations {
		req, _ := http.NewRequest("GET", url(d), nil)
		if resp, err := tr.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(tr)
	return max(0, float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))) / float64(cfg.destinations)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func printTable(w io.Writer, out Output) {
	fmt.Fprintf(w, "%d endpoints (%d down, %d throttling), %d deliveries\n\n", out.Destinations, out.Down, out.Throttling, out.Requests)
	fmt.Fprintf(w, "%-9s %16s %24s %24s %18s\n", "", "healthy success", "healthy retries refused", "sick attempts/request", "bytes/destination")
	for _, r := range out.Runs {
		fmt.Fprintf(w, "%-9s %15.2f%% %24d %24.3f %18.0f\n", r.Name, 100*r.HealthySuccessRate, r.HealthyRetriesRefused, r.SickAttemptsPerRequest, r.HeapBytesPerDestination)
	}
	fmt.Fprintln(w)
	for _, line := range findings(out) {
		fmt.Fprintln(w, line)
	}
}

// findings says what the table shows, from its own numbers.
func findings(out Output) []string {
	var shared, perHost *Result
	for i := range out.Runs {
		switch out.Runs[i].Name {
		case "shared":
			shared = &out.Runs[i]
		case "per-host":
			perHost = &out.Runs[i]
		}
	}
	if shared == nil || perHost == nil {
		return nil
	}
	var lines []string
	switch {
	case shared.HealthyRetriesRefused > perHost.HealthyRetriesRefused:
		lines = append(lines, fmt.Sprintf("Shared, the sick endpoints spent the one budget and cut the one rate: %d deliveries to healthy endpoints had a retry or a send refused (per host: %d).",
			shared.HealthyRetriesRefused, perHost.HealthyRetriesRefused))
	default:
		lines = append(lines, fmt.Sprintf("Healthy endpoints had %d refusals shared and %d per host: the sick ones did not cost them here.",
			shared.HealthyRetriesRefused, perHost.HealthyRetriesRefused))
	}
	lines = append(lines, fmt.Sprintf("Healthy deliveries succeeded %.2f%% of the time shared, %.2f%% per host.",
		100*shared.HealthySuccessRate, 100*perHost.HealthySuccessRate))
	lines = append(lines, fmt.Sprintf("Sick endpoints got %.3f attempts per delivery per host (%.3f shared): each spends its own budget, then gets one attempt a delivery.",
		perHost.SickAttemptsPerRequest, shared.SickAttemptsPerRequest))
	lines = append(lines, fmt.Sprintf("Each destination tracked costs %.0f bytes.", perHost.HeapBytesPerDestination))
	return lines
}
