// Command deadlines measures retryhttp's deadlines that cross services
// (Policy.PropagateDeadline) and attempt timeouts that follow the
// dependency (Policy.AttemptTimeoutQuantile), over real loopback services.
//
//	go run ./examples/deadlines              # the tables
//	go run ./examples/deadlines -json        # the same, as JSON (docs/deadlines.json)
//	go run ./examples/deadlines -scale 0.05 -seeds 1  # shorter (CI)
//
// Chains: a caller with a 1s deadline calls S1, which calls S2, which calls
// S3, which calls the bottom, each through a Transport and under Handler.
// The bottom works for a lognormal time of median 200ms and p99 2s, or
// until its request's context ends, and fails one attempt in ten with a
// 503 at the end of its work. The second chain has a proxy between S1 and
// S2 (httputil.ReverseProxy) whose upstream request does not end when its
// client leaves. Each chain runs with and without PropagateDeadline.
//
// Shift: a dependency whose latency is lognormal of median 5ms and p99.9
// 60ms, then median 50ms and p99.9 500ms, then back; one attempt in 2,000
// hangs. A fixed AttemptTimeout of 60ms is compared with
// AttemptTimeoutQuantile 0.999 under an AttemptTimeout of 2s.
//
// Each scenario runs once per seed, and the counts are summed over the
// seeds: a regime holds about 5 hung attempts a seed, too few for a median.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
)

func main() {
	asJSON := flag.Bool("json", false, "print one JSON object instead of tables")
	scale := flag.Float64("scale", 1, "share of the requests of each scenario (1: the saved run)")
	seed := flag.Uint64("seed", 1, "the first seed of the latencies drawn")
	nseeds := flag.Int("seeds", 3, "seeds to run each scenario with, from -seed on")
	only := flag.String("only", "", "run only the chains or the shift")
	flag.Parse()
	n := func(k int) int { return max(int(float64(k)**scale), 20) }

	res := result{Seed: *seed, Seeds: max(*nseeds, 1), Scale: *scale}
	var seeds []uint64
	for i := range res.Seeds {
		seeds = append(seeds, *seed+uint64(i))
	}
	for _, detached := range []bool{false, true} {
		for _, propagate := range []bool{false, true} {
			if *only != "shift" {
				var c chainResult
				for _, s := range seeds {
					c.add(runChain(n(chainRequests), detached, propagate, s))
				}
				c.round()
				res.Chains = append(res.Chains, c)
			}
		}
	}
	res.Shift = shiftScenario{
		Quantile: 0.999, FixedTimeoutMs: 60, CeilingMs: 2000, HangEvery: hangEvery,
	}
	regimes := []regime{
		{"warm-up", 5, 60, n(1000)},
		{"fast", 5, 60, n(6000)},
		{"slow", 50, 500, n(12000)},
		{"fast again", 5, 60, n(12000)},
	}
	for _, quantile := range []bool{false, true} {
		if *only != "chains" {
			res.Shift.Runs = append(res.Shift.Runs, runShift(regimes, quantile, seeds))
		}
	}
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	print(res)
}

type result struct {
	Seed   uint64        `json:"seed"`  // the first seed
	Seeds  int           `json:"seeds"` // how many, from Seed on
	Scale  float64       `json:"scale"`
	Chains []chainResult `json:"chains"`
	Shift  shiftScenario `json:"shift"`
}

// chainResult is one chain's runs, summed over the seeds: what the callers
// got and what the bottom did.
type chainResult struct {
	Name      string `json:"name"`
	Detached  bool   `json:"detached_hop"`
	Propagate bool   `json:"propagate"`
	Requests  int    `json:"requests"`
	CallerOK  int    `json:"caller_ok"` // 2xx within the deadline
	// The bottom's attempts: started, answered (work done), ended after
	// the caller had given up (its deadline passed), and its busy time, in
	// all and after the callers gave up.
	BottomAttempts   int     `json:"bottom_attempts"`
	BottomAnswered   int     `json:"bottom_answered"`
	EndedAfterGiveUp int     `json:"bottom_ended_after_caller_gave_up"`
	BusySeconds      float64 `json:"bottom_busy_seconds"`
	BusyAfterGiveUp  float64 `json:"bottom_busy_seconds_after_caller_gave_up"`
	// The busy time of the attempts that answered before their caller
	// gave up. No scheme that keeps those answers can cut it: the most
	// that can be cut is the share of the rest.
	BusyInTime float64 `json:"bottom_busy_seconds_answered_in_time"`
	MostCut    float64 `json:"most_work_any_scheme_can_cut"`
	// Attempts S3 did not send because too little time was left
	// (StopDeadline before an attempt), with the expected number of them
	// that would have ended in time, from the bottom's distribution.
	// Answered counts the 503s too: no scheme knows them before.
	Refused            int     `json:"refused_attempts"`
	RefusedWouldFinish float64 `json:"refused_would_have_finished"`
}

// add sums run r into c.
func (c *chainResult) add(r chainResult) {
	c.Name, c.Detached, c.Propagate = r.Name, r.Detached, r.Propagate
	c.Requests += r.Requests
	c.CallerOK += r.CallerOK
	c.BottomAttempts += r.BottomAttempts
	c.BottomAnswered += r.BottomAnswered
	c.EndedAfterGiveUp += r.EndedAfterGiveUp
	c.BusySeconds += r.BusySeconds
	c.BusyAfterGiveUp += r.BusyAfterGiveUp
	c.BusyInTime += r.BusyInTime
	c.Refused += r.Refused
	c.RefusedWouldFinish += r.RefusedWouldFinish
}

// round rounds the sums for the report, and sets MostCut.
func (c *chainResult) round() {
	if c.BusySeconds > 0 {
		c.MostCut = round(1-c.BusyInTime/c.BusySeconds, 3)
	}
	c.BusySeconds, c.BusyAfterGiveUp = round(c.BusySeconds, 3), round(c.BusyAfterGiveUp, 3)
	c.BusyInTime = round(c.BusyInTime, 3)
	c.RefusedWouldFinish = round(c.RefusedWouldFinish, 2)
}

const (
	callerDeadline = time.Second
	bottomMedian   = 200 * time.Millisecond
	bottomP99      = 2 * time.Second
	bottomFailures = 10 // one attempt in this many ends in a 503
	concurrency    = 10 // callers at a time
	chainRequests  = 200
)

var bottomSigma = math.Log(float64(bottomP99)/float64(bottomMedian)) / 2.3263

// bottom is the chain's last service: its work and what it records.
type bottom struct {
	mu        sync.Mutex
	rng       *rand.Rand
	giveUp    sync.Map // request id -> the caller's deadline (time.Time)
	attempts  int
	answered  int
	after     int
	busy      time.Duration
	busyAfter time.Duration
	busyOK    time.Duration // of attempts answered before their caller gave up
	inflight  atomic.Int64
}

func (b *bottom) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	b.mu.Lock()
	d := time.Duration(float64(bottomMedian) * math.Exp(bottomSigma*b.rng.NormFloat64()))
	fail := b.rng.IntN(bottomFailures) == 0
	b.attempts++
	b.mu.Unlock()
	start := time.Now()
	timer := time.NewTimer(d)
	done := false
	select {
	case <-timer.C:
		done = true
	case <-r.Context().Done():
		timer.Stop()
	}
	end := time.Now()
	b.mu.Lock()
	b.busy += end.Sub(start)
	if done {
		b.answered++
	}
	if v, ok := b.giveUp.Load(r.Header.Get("X-Request-Id")); ok {
		if gu := v.(time.Time); end.After(gu) {
			b.after++
			b.busyAfter += end.Sub(later(start, gu))
		} else if done {
			b.busyOK += end.Sub(start)
		}
	}
	b.mu.Unlock()
	if !done {
		w.WriteHeader(http.StatusGatewayTimeout) // its deadline passed, or nobody waits
		return
	}
	if fail {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok")
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// forward is a service that calls next with its request's context and
// answers with next's status.
func forward(tr http.RoundTripper, next string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", next, nil)
		req.Header.Set("X-Request-Id", r.Header.Get("X-Request-Id"))
		resp, err := tr.RoundTrip(req)
		if err != nil {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		io.Copy(w, resp.Body)
	})
}

func runChain(requests int, detached, propagate bool, seed uint64) chainResult {
	name := "chain of 4"
	if detached {
		name = "chain of 4, a proxy that does not pass cancellation on"
	}
	res := chainResult{Name: name, Detached: detached, Propagate: propagate, Requests: requests}
	b := &bottom{rng: rand.New(rand.NewPCG(seed, 1))}
	var refusedMu sync.Mutex
	policy := retryhttp.Policy{PropagateDeadline: propagate}
	var closers []func()
	serve := func(h http.Handler) string {
		s := httptest.NewServer(retryhttp.Handler(h))
		closers = append(closers, s.Close)
		return s.URL
	}
	transport := func(onEnd func(*http.Request, retryhttp.Report)) *retryhttp.Transport {
		tr := &retryhttp.Transport{Policy: policy, OnEnd: onEnd}
		closers = append(closers, tr.CloseIdleConnections)
		return tr
	}
	next := serve(b)
	// S3 calls the bottom: its refusals are counted, each with the chance
	// that the attempt would have ended in time.
	s3 := transport(func(r *http.Request, rep retryhttp.Report) {
		if rep.Decision != retryhttp.StopDeadline || rep.Attempts != 0 {
			return
		}
		if d, ok := r.Context().Deadline(); ok {
			refusedMu.Lock()
			res.Refused++
			res.RefusedWouldFinish += lognormalCDF(time.Until(d), bottomMedian, bottomSigma)
			refusedMu.Unlock()
		}
	})
	next = serve(forward(s3, next))
	next = serve(forward(transport(nil), next))
	if detached {
		target, _ := url.Parse(next)
		proxy := httputil.NewSingleHostReverseProxy(target)
		proxy.ErrorLog = log.New(io.Discard, "", 0)
		proxy.Transport = &http.Transport{}
		ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			// A context that never ends while the proxy waits: with no Done
			// channel at all, ReverseProxy would watch the client's
			// connection itself.
			ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
			defer cancel()
			proxy.ServeHTTP(w, r.WithContext(ctx))
		}))
		closers = append(closers, ps.Close)
		next = ps.URL
	}
	next = serve(forward(transport(nil), next))
	caller := transport(nil)

	var ok atomic.Int64
	var wg sync.WaitGroup
	ids := make(chan int)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				ctx, cancel := context.WithTimeout(context.Background(), callerDeadline)
				d, _ := ctx.Deadline()
				b.giveUp.Store(strconv.Itoa(id), d)
				req, _ := http.NewRequestWithContext(ctx, "GET", next, nil)
				req.Header.Set("X-Request-Id", strconv.Itoa(id))
				resp, err := caller.RoundTrip(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode == 200 && ctx.Err() == nil {
						ok.Add(1)
					}
				}
				cancel()
			}
		}()
	}
	for id := range requests {
		ids <- id
	}
	close(ids)
	wg.Wait()
	// Work the callers abandoned may still run below a detached hop.
	for wait := time.Now(); b.inflight.Load() > 0 && time.Since(wait) < 30*time.Second; {
		time.Sleep(10 * time.Millisecond)
	}
	for _, c := range slices.Backward(closers) {
		c()
	}
	res.CallerOK = int(ok.Load())
	b.mu.Lock()
	defer b.mu.Unlock()
	res.BottomAttempts, res.BottomAnswered, res.EndedAfterGiveUp = b.attempts, b.answered, b.after
	res.BusySeconds, res.BusyAfterGiveUp, res.BusyInTime = b.busy.Seconds(), b.busyAfter.Seconds(), b.busyOK.Seconds()
	return res
}

// lognormalCDF is the chance that a lognormal latency of that median and
// sigma is under d.
func lognormalCDF(d, median time.Duration, sigma float64) float64 {
	if d <= 0 {
		return 0
	}
	z := math.Log(float64(d)/float64(median)) / sigma
	return 0.5 * math.Erfc(-z/math.Sqrt2)
}

func round(x float64, decimals int) float64 {
	p := math.Pow(10, float64(decimals))
	return math.Round(x*p) / p
}

// The shift.

const hangEvery = 2000 // one attempt in this many never answers

type regime struct {
	Name     string
	MedianMs float64
	P999Ms   float64
	Requests int
}

type shiftScenario struct {
	Quantile       float64 `json:"quantile"`
	FixedTimeoutMs float64 `json:"fixed_timeout_ms"`
	CeilingMs      float64 `json:"quantile_ceiling_ms"`
	HangEvery      int     `json:"hang_every"`
	// Each run's regimes hold the counts of every seed, summed; Requests is
	// a seed's. Cuts, for the chart, is the first seed's.
	Runs []shiftRun `json:"runs"`
}

type shiftRun struct {
	Name    string        `json:"name"`
	Regimes []regimeStats `json:"regimes"`
	// Timeline: the attempt timeout met by each attempt it cut, in ms,
	// by request number, for the chart.
	Cuts [][2]float64 `json:"cuts"`
}

type regimeStats struct {
	Name          string  `json:"name"`
	MedianMs      float64 `json:"median_ms"`
	P999Ms        float64 `json:"p999_ms"`
	Requests      int     `json:"requests"`
	Attempts      int     `json:"attempts"`
	FalseTimeouts int     `json:"false_timeouts"` // cut, and would have answered
	FalseRate     float64 `json:"false_timeout_rate"`
	Hung          int     `json:"hung_attempts"`
	HoldMedianMs  float64 `json:"hung_hold_median_ms"` // how long a hung attempt held the caller
	HoldMaxMs     float64 `json:"hung_hold_max_ms"`
	HoldOverP999  float64 `json:"hung_hold_median_over_p999"`
	Failed        int     `json:"requests_failed"`
}

// draw is the latency of attempt n of request id, the same for the server
// and the client's bookkeeping; negative for an attempt that hangs.
func draw(seed uint64, id, n int, r regime) time.Duration {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d", id, n)
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	if rng.IntN(hangEvery) == 0 {
		return -1
	}
	sigma := math.Log(r.P999Ms/r.MedianMs) / 3.0902
	return time.Duration(r.MedianMs * math.Exp(sigma*rng.NormFloat64()) * float64(time.Millisecond))
}

func runShift(regimes []regime, quantile bool, seeds []uint64) shiftRun {
	// The regime of each request, by its number.
	var bounds []int
	total := 0
	for _, r := range regimes {
		total += r.Requests
		bounds = append(bounds, total)
	}
	regimeOf := func(id int) int {
		i, _ := slices.BinarySearch(bounds, id+1)
		return i
	}
	run := shiftRun{Name: "fixed AttemptTimeout 60ms"}
	policy := retryhttp.Policy{AttemptTimeout: 60 * time.Millisecond, SendAttemptHeader: true}
	if quantile {
		run.Name = "AttemptTimeoutQuantile 0.999, AttemptTimeout 2s"
		policy = retryhttp.Policy{AttemptTimeout: 2 * time.Second, AttemptTimeoutQuantile: 0.999, SendAttemptHeader: true}
	}
	stats := make([]regimeStats, len(regimes))
	holds := make([][]float64, len(regimes))
	for i, r := range regimes {
		stats[i] = regimeStats{Name: r.Name, MedianMs: r.MedianMs, P999Ms: r.P999Ms, Requests: r.Requests}
	}
	for i, seed := range seeds {
		cuts := shiftOnce(regimes, regimeOf, policy, seed, stats, holds)
		if i == 0 {
			run.Cuts = cuts
		}
	}
	for i := range stats {
		s := &stats[i]
		if s.Attempts > 0 {
			s.FalseRate = round(float64(s.FalseTimeouts)/float64(s.Attempts), 5)
		}
		if h := holds[i]; len(h) > 0 {
			slices.Sort(h)
			s.HoldMedianMs, s.HoldMaxMs = round(h[len(h)/2], 1), round(h[len(h)-1], 1)
			s.HoldOverP999 = round(s.HoldMedianMs/s.P999Ms, 2)
		}
	}
	run.Regimes = stats
	return run
}

// shiftOnce runs the regimes once with a new Transport and server, adds
// its counts to stats and its hung attempts' holds to holds, and returns
// the attempt timeout met by each attempt cut, by request number.
func shiftOnce(regimes []regime, regimeOf func(int) int, policy retryhttp.Policy, seed uint64,
	stats []regimeStats, holds [][]float64) [][2]float64 {
	total := 0
	for _, r := range regimes {
		total += r.Requests
	}
	var cuts [][2]float64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.Atoi(r.Header.Get("X-Request-Id"))
		n, _ := strconv.Atoi(r.Header.Get("Retry-Attempt"))
		d := draw(seed, id, n, regimes[regimeOf(id)])
		if d < 0 {
			<-r.Context().Done()
			return
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
			io.WriteString(w, "ok")
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()

	var mu sync.Mutex
	tr := &retryhttp.Transport{Policy: policy, Budget: retryhttp.NewTokenBucket(math.MaxInt32),
		OnAttempt: func(a retryhttp.Attempt) {
			id, _ := strconv.Atoi(a.Request.Header.Get("X-Request-Id"))
			i := regimeOf(id)
			mu.Lock()
			defer mu.Unlock()
			s := &stats[i]
			s.Attempts++
			if !errors.Is(a.Err, retryhttp.ErrAttemptTimeout) {
				return
			}
			ms := float64(a.Duration) / float64(time.Millisecond)
			cuts = append(cuts, [2]float64{float64(id), round(ms, 2)})
			if draw(seed, id, a.Number, regimes[i]) < 0 {
				s.Hung++
				holds[i] = append(holds[i], ms)
			} else {
				s.FalseTimeouts++
			}
		}}
	defer tr.CloseIdleConnections()

	var wg sync.WaitGroup
	ids := make(chan int)
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				req, _ := http.NewRequest("GET", srv.URL, nil)
				req.Header.Set("X-Request-Id", strconv.Itoa(id))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					mu.Lock()
					stats[regimeOf(id)].Failed++
					mu.Unlock()
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for id := range total {
		ids <- id
	}
	close(ids)
	wg.Wait()
	slices.SortFunc(cuts, func(a, b [2]float64) int { return int(a[0] - b[0]) })
	return cuts
}

func print(res result) {
	if len(res.Chains) == 0 {
		res.Chains = []chainResult{{}}
	}
	fmt.Printf("Chains: a caller with a %v deadline, 4 services, a bottom lognormal of median %v and p99 %v (%d requests each, %d seeds)\n\n",
		callerDeadline, bottomMedian, bottomP99, res.Chains[0].Requests, res.Seeds)
	fmt.Printf("%-56s %-10s %9s %9s %14s %10s %14s %12s %8s\n", "chain", "propagate", "caller ok", "attempts", "ended after", "busy (s)", "busy after (s)", "most cut", "refused")
	for _, c := range res.Chains {
		fmt.Printf("%-56s %-10v %9d %9d %14d %10.1f %14.1f %11.1f%% %8d\n", c.Name, c.Propagate, c.CallerOK, c.BottomAttempts,
			c.EndedAfterGiveUp, c.BusySeconds, c.BusyAfterGiveUp, 100*c.MostCut, c.Refused)
	}
	fmt.Printf("\nShift: median 5ms, p99.9 60ms -> 50ms, 500ms -> back; one attempt in %d hangs; %d seeds\n", res.Shift.HangEvery, res.Seeds)
	for _, r := range res.Shift.Runs {
		fmt.Printf("\n%s\n%-11s %9s %9s %8s %8s %14s %12s %10s\n", r.Name, "regime", "attempts", "false", "rate", "hung", "hold median", "hold max", "/ p99.9")
		for _, s := range r.Regimes {
			fmt.Printf("%-11s %9d %9d %7.3f%% %8d %12.1fms %10.1fms %9.2fx\n", s.Name, s.Attempts, s.FalseTimeouts, 100*s.FalseRate, s.Hung, s.HoldMedianMs, s.HoldMaxMs, s.HoldOverP999)
		}
	}
}
