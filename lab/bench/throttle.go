package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivethrottler"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/herdproof/retryhttp"
)

// ThrottleConfig is the throttling comparison's workload: a server that
// admits Capacity requests per second (a token bucket of depth Burst) and
// answers 429 above it, halving its capacity half-way through, and Clients
// clients that each want PerClient requests per second, every request with
// a deadline of Timeout.
type ThrottleConfig struct {
	Capacity  float64
	Burst     float64
	Clients   int
	PerClient float64
	Duration  time.Duration
	Timeout   time.Duration
	// Seed seeds the clients' request times (Poisson arrivals).
	Seed uint64
}

// DefaultThrottleConfig is the workload of docs/throttling.md: 20 clients
// wanting 50 requests per second each, five times the capacity of 200, for
// 60 s, the capacity halving to 100 at 30 s.
var DefaultThrottleConfig = ThrottleConfig{Capacity: 200, Burst: 20, Clients: 20, PerClient: 50,
	Duration: 60 * time.Second, Timeout: time.Second, Seed: 1}

// ThrottleRun is one implementation's result.
type ThrottleRun struct {
	Name string `json:"name"`
	// Attempts and Throttled are what the server received and answered
	// with 429, in total.
	Attempts  int `json:"attempts"`
	Throttled int `json:"throttled"`
	// GoodputRatio is the 2xx per second over the capacity once the run
	// converged (over the whole phase when it never did).
	GoodputRatio float64 `json:"goodput_ratio"`
	// ConvergeSeconds is how long after the start the attempts per second
	// (over one second) came within 10% of the capacity and stayed there
	// for 3 s; ReconvergeSeconds the same after the capacity halved. Null
	// when that never happened.
	ConvergeSeconds   *float64 `json:"converge_seconds"`
	ReconvergeSeconds *float64 `json:"reconverge_seconds"`
	// Jain is Jain's fairness index of the clients' 2xx counts: 1 when all
	// got the same, 1/Clients when one got everything.
	Jain float64 `json:"jain"`
	// PerSecond is what the server saw in each second.
	PerSecond []ThrottleSecond `json:"per_second"`
}

// ThrottleSecond is one second at the server.
type ThrottleSecond struct {
	Attempts  int `json:"attempts"`
	Throttled int `json:"throttled"`
	OK        int `json:"ok"`
}

// throttleImpls are the implementations compared, in the JSON's order (the
// matrix's peers: the AWS SDK's adaptive mode through a real STS client).
func throttleImpls(cfg ThrottleConfig) []ThrottlePeer {
	return []ThrottlePeer{
		RetryHTTPPeer(PeerNone, nil),
		AWSAdaptivePeer(),
		TransportPeer(PeerFailsafe, func(base http.RoundTripper) http.RoundTripper {
			return newFailsafeThrottler(base, cfg)
		}),
		retryHTTPLimited(cfg),
	}
}

// retryHTTPLimited is this library's Transport with the zero RateLimiter,
// the rest at its defaults.
func retryHTTPLimited(ThrottleConfig) ThrottlePeer {
	return RetryHTTPPeer(PeerRetryHTTP, func() *retryhttp.RateLimiter { return &retryhttp.RateLimiter{} })
}

// binWidth is the resolution of the server's counts.
const binWidth = 100 * time.Millisecond

// capacityServer admits requests from a token bucket and answers 429 when
// it is empty; its rate halves at half time. It counts what it saw per bin.
// Its answers are STS's (see stsOK), for the AWS SDK's client.
type capacityServer struct {
	cfg   ThrottleConfig
	start time.Time

	mu                      sync.Mutex
	tokens                  float64
	last                    time.Time
	attempts, throttled, ok []int
}

func newCapacityServer(cfg ThrottleConfig, start time.Time) *capacityServer {
	bins := int(cfg.Duration/binWidth) + 1
	return &capacityServer{cfg: cfg, start: start, tokens: cfg.Burst, last: start,
		attempts: make([]int, bins), throttled: make([]int, bins), ok: make([]int, bins)}
}

func (s *capacityServer) rate(now time.Time) float64 {
	if now.Sub(s.start) >= s.cfg.Duration/2 {
		return s.cfg.Capacity / 2
	}
	return s.cfg.Capacity
}

func (s *capacityServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	s.mu.Lock()
	s.tokens = min(s.cfg.Burst, s.tokens+now.Sub(s.last).Seconds()*s.rate(now))
	s.last = now
	admitted := s.tokens >= 1
	if admitted {
		s.tokens--
	}
	if b := int(now.Sub(s.start) / binWidth); b >= 0 && b < len(s.attempts) {
		s.attempts[b]++
		if admitted {
			s.ok[b]++
		} else {
			s.throttled[b]++
		}
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/xml")
	if !admitted {
		w.WriteHeader(http.StatusTooManyRequests)
		io.WriteString(w, stsThrottled)
		return
	}
	io.WriteString(w, stsOK)
}

// handlerTransport serves each request with a handler in the calling
// goroutine: no network, so the whole comparison runs in a synctest bubble.
type handlerTransport struct{ h http.Handler }

func (t handlerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		req.Body.Close()
	}
	if err := req.Context().Err(); err != nil {
		return nil, err
	}
	rec := httptest.NewRecorder()
	t.h.ServeHTTP(rec, req)
	return rec.Result(), nil
}

// meanRun averages runs: counts, ratios and times (a time is nil if any
// run never converged).
func meanRun(runs []ThrottleRun) ThrottleRun {
	var m ThrottleRun
	n := float64(len(runs))
	var conv, reconv float64
	converged, reconverged := true, true
	for _, r := range runs {
		m.Attempts += r.Attempts
		m.Throttled += r.Throttled
		m.GoodputRatio += r.GoodputRatio / n
		m.Jain += r.Jain / n
		if r.ConvergeSeconds == nil {
			converged = false
		} else {
			conv += *r.ConvergeSeconds / n
		}
		if r.ReconvergeSeconds == nil {
			reconverged = false
		} else {
			reconv += *r.ReconvergeSeconds / n
		}
	}
	m.Attempts = int(math.Round(float64(m.Attempts) / n))
	m.Throttled = int(math.Round(float64(m.Throttled) / n))
	m.GoodputRatio = math.Round(m.GoodputRatio*1000) / 1000
	m.Jain = math.Round(m.Jain*1000) / 1000
	if converged {
		c := math.Round(conv*10) / 10
		m.ConvergeSeconds = &c
	}
	if reconverged {
		c := math.Round(reconv*10) / 10
		m.ReconvergeSeconds = &c
	}
	return m
}

// ThrottleInMemory runs the implementations called names (every one when
// none is named) against a server of its own called in memory (see
// handlerTransport), each in a synctest bubble of its own, as subtests of
// t: 60 s of fake time take a few seconds (most of it the AWS SDK's).
func ThrottleInMemory(t *testing.T, cfg ThrottleConfig, names ...string) []ThrottleRun {
	var impls []ThrottlePeer
	for _, impl := range throttleImpls(cfg) {
		if len(names) == 0 || slices.Contains(names, impl.Name) {
			impls = append(impls, impl)
		}
	}
	runs := make([]ThrottleRun, len(impls))
	t.Run("in-memory", func(t *testing.T) {
		for i, impl := range impls {
			t.Run(impl.Name, func(t *testing.T) {
				synctest.Test(t, func(*testing.T) {
					srv := newCapacityServer(cfg, time.Now())
					runs[i] = runThrottle(cfg, impl, srv, handlerTransport{srv}, "http://capacity.test/")
				})
			})
		}
	})
	return runs
}

// ThrottleLoopback runs every implementation against a loopback server of
// its own, in real time, one after the other: the AWS SDK's waiters all
// wake when a send token is due (each computes the same wait), and with
// hundreds of them the CPU they take would slow whatever runs beside them.
func ThrottleLoopback(cfg ThrottleConfig) []ThrottleRun {
	var runs []ThrottleRun
	for _, impl := range throttleImpls(cfg) {
		start := time.Now().Add(200 * time.Millisecond)
		srv := newCapacityServer(cfg, start)
		ts := httptest.NewServer(srv)
		base := &http.Transport{MaxIdleConnsPerHost: 200}
		time.Sleep(time.Until(start))
		runs = append(runs, runThrottle(cfg, impl, srv, base, ts.URL))
		base.CloseIdleConnections()
		ts.Close()
	}
	return runs
}

// runThrottle drives cfg.Clients clients, each a client of its own from
// impl, at cfg.PerClient requests per second each (Poisson arrivals).
func runThrottle(cfg ThrottleConfig, impl ThrottlePeer, srv *capacityServer, base http.RoundTripper, url string) ThrottleRun {
	oks := make([]int, cfg.Clients)
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := srv.start
	for c := range cfg.Clients {
		call := impl.NewClient(ClientEnv{Base: base, URL: url, Rand: lockedRand(cfg.Seed, uint64(1000+c))})
		rnd := rand.New(rand.NewPCG(cfg.Seed, uint64(c)))
		wg.Go(func() {
			var reqs sync.WaitGroup
			at := start
			for {
				// Poisson arrivals: fixed spacing would let the same
				// clients always find the server's bucket refilled.
				at = at.Add(time.Duration(rnd.ExpFloat64() / cfg.PerClient * float64(time.Second)))
				if at.Sub(start) >= cfg.Duration {
					break
				}
				time.Sleep(time.Until(at))
				reqs.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), cfg.Timeout)
					defer cancel()
					if call(ctx) {
						mu.Lock()
						oks[c]++
						mu.Unlock()
					}
				})
			}
			reqs.Wait()
		})
	}
	wg.Wait()
	return summarize(cfg, impl.Name, srv, oks)
}

func summarize(cfg ThrottleConfig, name string, srv *capacityServer, oks []int) ThrottleRun {
	srv.mu.Lock()
	defer srv.mu.Unlock()
	run := ThrottleRun{Name: name, Jain: jain(oks)}
	perSecond := int(time.Second / binWidth)
	bins := int(cfg.Duration / binWidth)
	for b := range bins {
		run.Attempts += srv.attempts[b]
		run.Throttled += srv.throttled[b]
		if b%perSecond == 0 {
			run.PerSecond = append(run.PerSecond, ThrottleSecond{})
		}
		s := &run.PerSecond[len(run.PerSecond)-1]
		s.Attempts += srv.attempts[b]
		s.Throttled += srv.throttled[b]
		s.OK += srv.ok[b]
	}
	half := bins / 2
	var good, secs float64
	for i, phase := range [][2]int{{0, half}, {half, bins}} {
		capacity := cfg.Capacity / float64(1+i)
		conv, from := converge(srv.attempts, phase[0], phase[1], capacity)
		if conv >= 0 {
			c := math.Round(conv*10) / 10
			if i == 0 {
				run.ConvergeSeconds = &c
			} else {
				run.ReconvergeSeconds = &c
			}
		}
		for b := from; b < phase[1]; b++ {
			good += float64(srv.ok[b]) / capacity
		}
		secs += float64(phase[1]-from) * binWidth.Seconds()
	}
	if secs > 0 {
		run.GoodputRatio = math.Round(good/secs*1000) / 1000
	}
	return run
}

// converge finds when, within bins [from, to), the attempts over the last
// second came within 10% of capacity and stayed there for 3 s. It returns the seconds since from and the first bin
// after that second, or -1 and from when that never happened.
func converge(attempts []int, from, to int, capacity float64) (float64, int) {
	window := int(time.Second / binWidth)
	stay := 3 * window
	within := func(b int) bool { // the second ending with bin b
		n := 0
		for i := b - window + 1; i <= b; i++ {
			n += attempts[i]
		}
		return math.Abs(float64(n)-capacity) <= 0.1*capacity
	}
	for b := from + window - 1; b+stay <= to; b++ {
		ok := true
		for e := b; e < b+stay; e++ {
			if !within(e) {
				ok = false
				break
			}
		}
		if ok {
			return float64(b+1-from) * binWidth.Seconds(), b + 1
		}
	}
	return -1, from
}

// jain is Jain's fairness index of xs.
func jain(xs []int) float64 {
	var sum, sq float64
	for _, x := range xs {
		sum += float64(x)
		sq += float64(x) * float64(x)
	}
	if sq == 0 {
		return 0
	}
	return math.Round(sum*sum/(float64(len(xs))*sq)*1000) / 1000
}

// newFailsafeThrottler is failsafe-go's client-side adaptive throttler (the
// SRE book's, adaptivethrottler.NewBuilder with its defaults: reject once
// fewer than 90% of recent executions succeed) counting 429s as failures,
// inside failsafehttp's retry policy with a backoff like this library's
// after a throttle (1 s doubling, full jitter, capped at 20 s); a request
// the throttler rejects is not retried.
func newFailsafeThrottler(base http.RoundTripper, _ ThrottleConfig) http.RoundTripper {
	throttler := adaptivethrottler.NewBuilder[*http.Response]().
		HandleIf(func(resp *http.Response, err error) bool {
			return err == nil && resp.StatusCode == http.StatusTooManyRequests
		}).Build()
	retries := failsafehttp.NewRetryPolicyBuilder().
		WithBackoff(time.Second, 20*time.Second).
		WithJitterFactor(1).
		AbortOnErrors(adaptivethrottler.ErrExceeded).
		Build()
	return failsafehttp.NewRoundTripper(base, retries, throttler)
}

// ThrottleTable renders runs as a Markdown table.
func ThrottleTable(runs []ThrottleRun) string {
	var b strings.Builder
	b.WriteString("| implementation | attempts | 429s | goodput / capacity | converge | after the halving | Jain |\n|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %d | %d | %.3f | %s | %s | %.3f |\n", r.Name, r.Attempts, r.Throttled, r.GoodputRatio,
			secs(r.ConvergeSeconds), secs(r.ReconvergeSeconds), r.Jain)
	}
	return b.String()
}

// secs renders a convergence time.
func secs(p *float64) string {
	if p == nil {
		return "never"
	}
	return strconv.FormatFloat(*p, 'f', 1, 64) + " s"
}
