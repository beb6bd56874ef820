// Command deadlinecheck checks the claim that, with Policy.PropagateDeadline
// on every Transport and Handler around every service, no bottom attempt
// ends after the top caller gave up, even behind a ReverseProxy whose
// upstream request does not end when its client leaves. It runs workloads
// the authors did not tune on, over loopback, with and without
// PropagateDeadline.
//
//	go run . -json > results.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
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
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
)

// dist is the bottom's latency distribution.
type dist struct {
	name string
	draw func(r *rand.Rand) time.Duration
	cdf  func(d time.Duration) float64
}

func lognormal(median, p99 time.Duration) dist {
	sigma := math.Log(float64(p99)/float64(median)) / 2.3263
	return dist{
		name: fmt.Sprintf("lognormal median %v p99 %v", median, p99),
		draw: func(r *rand.Rand) time.Duration {
			return time.Duration(float64(median) * math.Exp(sigma*r.NormFloat64()))
		},
		cdf: func(d time.Duration) float64 {
			if d <= 0 {
				return 0
			}
			z := math.Log(float64(d)/float64(median)) / sigma
			return 0.5 * math.Erfc(-z/math.Sqrt2)
		},
	}
}

func bimodal() dist {
	return dist{
		name: "bimodal 90% 5ms, 10% 5s",
		draw: func(r *rand.Rand) time.Duration {
			if r.IntN(10) == 0 {
				return 5 * time.Second
			}
			return 5 * time.Millisecond
		},
		cdf: func(d time.Duration) float64 {
			switch {
			case d >= 5*time.Second:
				return 1
			case d >= 5*time.Millisecond:
				return 0.9
			}
			return 0
		},
	}
}

func uniform2s() dist {
	return dist{
		name: "uniform 0-2s",
		draw: func(r *rand.Rand) time.Duration { return time.Duration(r.Int64N(int64(2 * time.Second))) },
		cdf: func(d time.Duration) float64 {
			return math.Max(0, math.Min(1, float64(d)/float64(2*time.Second)))
		},
	}
}

type workload struct {
	Name           string        `json:"name"`
	Depth          int           `json:"depth"` // services, the bottom included
	Detached       bool          `json:"detached_proxy"`
	CallerDeadline time.Duration `json:"-"`
	DeadlineMs     int64         `json:"caller_deadline_ms"`
	Dist           dist          `json:"-"`
	DistName       string        `json:"bottom_latency"`
	FailPct        int           `json:"bottom_503_pct"`
	MaxAttempts    int           `json:"max_attempts"`
	AttemptTimeout time.Duration `json:"-"`
	AttemptTOms    int64         `json:"attempt_timeout_ms"`
	HopWork        time.Duration `json:"-"`
	HopWorkMs      int64         `json:"s1_sleep_ms"`
	HopTimeout     time.Duration `json:"-"`
	HopTimeoutMs   int64         `json:"s1_policy_timeout_ms"`
	ProxyDelay     time.Duration `json:"-"`
	ProxyDelayMs   int64         `json:"proxy_queue_ms"` // the detached proxy holds each request this long first
	CancelOnly     bool          `json:"caller_cancels"` // the caller has no deadline: it cancels at CallerDeadline
	Concurrency    int           `json:"concurrency"`
	Requests       int           `json:"requests"`
}

type outcome struct {
	Propagate        bool    `json:"propagate"`
	CallerOK         int     `json:"caller_ok"`
	BottomAttempts   int     `json:"bottom_attempts"`
	EndedAfterGiveUp int     `json:"bottom_ended_after_caller_gave_up"`
	MaxLatenessMs    float64 `json:"max_lateness_ms"`
	// The attempt that ended nearest the caller's deadline: end minus
	// deadline, negative when it ended in time.
	ClosestMs float64 `json:"closest_end_minus_give_up_ms"`
	// Bottom attempts whose own context deadline (from the header) was
	// after the caller's, and by how much at most: the propagation's share
	// of the lateness, apart from the bottom waking late.
	DeadlinePastGiveUp  int     `json:"bottom_deadline_after_give_up"`
	MaxDeadlinePastMs   float64 `json:"max_bottom_deadline_past_give_up_ms"`
	MaxWakeAfterOwnDLms float64 `json:"max_end_after_own_deadline_ms"`
	BusySeconds         float64 `json:"bottom_busy_seconds"`
	BusyAfterGiveUp     float64 `json:"bottom_busy_seconds_after_give_up"`
	// StopDeadline with 0 attempts at any hop; at the hop that calls the
	// bottom, with the expected number that would have ended in time.
	RefusedAnyHop      int     `json:"refused_any_hop"`
	RefusedAtBottomHop int     `json:"refused_at_bottom_hop"`
	RefusedWouldFinish float64 `json:"refused_would_have_finished"`
	StillInflight      int64   `json:"bottom_inflight_at_end"`
	WallSeconds        float64 `json:"wall_seconds"`
}

type bottom struct {
	mu        sync.Mutex
	rng       *rand.Rand
	dist      dist
	failPct   int
	giveUp    sync.Map
	attempts  int
	after     int
	maxLate   time.Duration
	closest   time.Duration
	dlPast    int
	maxDLPast time.Duration
	maxWake   time.Duration
	any       bool
	busy      time.Duration
	busyAfter time.Duration
	inflight  atomic.Int64
}

func (b *bottom) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b.inflight.Add(1)
	defer b.inflight.Add(-1)
	b.mu.Lock()
	d := b.dist.draw(b.rng)
	fail := b.rng.IntN(100) < b.failPct
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
	if v, ok := b.giveUp.Load(r.Header.Get("X-Request-Id")); ok {
		gu := v.(time.Time)
		if own, ok := r.Context().Deadline(); ok {
			if own.After(gu) {
				b.dlPast++
				b.maxDLPast = max(b.maxDLPast, own.Sub(gu))
			}
			if !done {
				b.maxWake = max(b.maxWake, end.Sub(own))
			}
		}
		if !b.any || end.Sub(gu) > b.closest {
			b.closest, b.any = end.Sub(gu), true
		}
		if end.After(gu) {
			b.after++
			b.maxLate = max(b.maxLate, end.Sub(gu))
			s := start
			if gu.After(s) {
				s = gu
			}
			b.busyAfter += end.Sub(s)
		}
	}
	b.mu.Unlock()
	switch {
	case !done:
		w.WriteHeader(http.StatusGatewayTimeout)
	case fail:
		w.WriteHeader(http.StatusServiceUnavailable)
	default:
		io.WriteString(w, "ok")
	}
}

func forward(tr http.RoundTripper, next string, work time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if work > 0 {
			time.Sleep(work) // its own work, which does not watch the context
		}
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

func run(wl workload, propagate bool, seed uint64) outcome {
	res := outcome{Propagate: propagate}
	b := &bottom{rng: rand.New(rand.NewPCG(seed, 1)), dist: wl.Dist, failPct: wl.FailPct}
	var mu sync.Mutex
	base := retryhttp.Policy{PropagateDeadline: propagate, MaxAttempts: wl.MaxAttempts, AttemptTimeout: wl.AttemptTimeout}
	var closers []func()
	serve := func(h http.Handler) string {
		s := httptest.NewServer(retryhttp.Handler(h))
		closers = append(closers, s.Close)
		return s.URL
	}
	transport := func(p retryhttp.Policy, atBottom bool) *retryhttp.Transport {
		tr := &retryhttp.Transport{Policy: p, OnEnd: func(r *http.Request, rep retryhttp.Report) {
			if rep.Decision != retryhttp.StopDeadline || rep.Attempts != 0 {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			res.RefusedAnyHop++
			if atBottom {
				res.RefusedAtBottomHop++
				if d, ok := r.Context().Deadline(); ok {
					res.RefusedWouldFinish += wl.Dist.cdf(time.Until(d))
				}
			}
		}}
		closers = append(closers, tr.CloseIdleConnections)
		return tr
	}
	// Services S1..S(depth-1) above the bottom; S1 is the top one.
	next := serve(b)
	for i := wl.Depth - 1; i >= 1; i-- {
		p := base
		var work time.Duration
		if i == 1 {
			p.Timeout = wl.HopTimeout
			work = wl.HopWork
		}
		h := forward(transport(p, i == wl.Depth-1), next, work)
		if i == 1 && wl.Detached {
			// S1 -> proxy -> S2 (or the bottom at depth 2).
			target, _ := url.Parse(next)
			proxy := httputil.NewSingleHostReverseProxy(target)
			proxy.ErrorLog = log.New(io.Discard, "", 0)
			proxy.Transport = &http.Transport{MaxIdleConnsPerHost: 100}
			ps := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
				defer cancel()
				if wl.ProxyDelay > 0 {
					time.Sleep(wl.ProxyDelay) // a queue, or the sidecar's own work
				}
				proxy.ServeHTTP(w, r.WithContext(ctx))
			}))
			closers = append(closers, ps.Close)
			h = forward(transport(p, false), ps.URL, work)
		}
		next = serve(h)
	}
	caller := transport(base, wl.Depth == 1)

	var ok atomic.Int64
	var wg sync.WaitGroup
	ids := make(chan int)
	t0 := time.Now()
	for range wl.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range ids {
				ctx, cancel := context.WithTimeout(context.Background(), wl.CallerDeadline)
				d, _ := ctx.Deadline()
				if wl.CancelOnly {
					cancel()
					var stop context.CancelFunc
					ctx, stop = context.WithCancel(context.Background())
					t := time.AfterFunc(wl.CallerDeadline, stop)
					d = time.Now().Add(wl.CallerDeadline)
					cancel = func() { t.Stop(); stop() }
				}
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
	for id := range wl.Requests {
		ids <- id
	}
	close(ids)
	wg.Wait()
	for wait := time.Now(); b.inflight.Load() > 0 && time.Since(wait) < 20*time.Second; {
		time.Sleep(10 * time.Millisecond)
	}
	res.StillInflight = b.inflight.Load()
	res.WallSeconds = round(time.Since(t0).Seconds(), 2)
	for _, c := range slices.Backward(closers) {
		c()
	}
	res.CallerOK = int(ok.Load())
	b.mu.Lock()
	defer b.mu.Unlock()
	res.BottomAttempts, res.EndedAfterGiveUp = b.attempts, b.after
	res.MaxLatenessMs = round(float64(b.maxLate)/1e6, 1)
	res.ClosestMs = round(float64(b.closest)/1e6, 1)
	res.DeadlinePastGiveUp = b.dlPast
	res.MaxDeadlinePastMs = round(float64(b.maxDLPast)/1e6, 1)
	res.MaxWakeAfterOwnDLms = round(float64(b.maxWake)/1e6, 1)
	res.BusySeconds, res.BusyAfterGiveUp = round(b.busy.Seconds(), 3), round(b.busyAfter.Seconds(), 3)
	res.RefusedWouldFinish = round(res.RefusedWouldFinish, 2)
	return res
}

func round(x float64, n int) float64 { p := math.Pow(10, float64(n)); return math.Round(x*p) / p }

func workloads(reqs int) []workload {
	ln := lognormal(200*time.Millisecond, 2*time.Second)
	def := workload{Depth: 4, Detached: true, CallerDeadline: time.Second, Dist: ln, FailPct: 10, MaxAttempts: 0, Concurrency: 10, Requests: reqs}
	mk := func(name string, f func(w *workload)) workload { w := def; w.Name = name; f(&w); return w }
	return []workload{
		mk("baseline (authors' setup)", func(w *workload) {}),
		mk("depth 2", func(w *workload) { w.Depth = 2 }),
		mk("depth 6", func(w *workload) { w.Depth = 6 }),
		mk("deadline 100ms", func(w *workload) { w.CallerDeadline = 100 * time.Millisecond }),
		mk("deadline 3s", func(w *workload) { w.CallerDeadline = 3 * time.Second }),
		mk("depth 6, deadline 100ms", func(w *workload) { w.Depth = 6; w.CallerDeadline = 100 * time.Millisecond }),
		mk("bimodal 90% 5ms / 10% 5s", func(w *workload) { w.Dist = bimodal() }),
		mk("uniform 0-2s", func(w *workload) { w.Dist = uniform2s() }),
		mk("retries: 30% 503, MaxAttempts 3", func(w *workload) { w.FailPct = 30; w.MaxAttempts = 3 }),
		mk("AttemptTimeout 300ms, 30% 503, MaxAttempts 3", func(w *workload) {
			w.FailPct = 30
			w.MaxAttempts = 3
			w.AttemptTimeout = 300 * time.Millisecond
		}),
		mk("S1 sleeps 50ms before calling down", func(w *workload) { w.HopWork = 50 * time.Millisecond }),
		mk("S1 Policy.Timeout 400ms (< 1s)", func(w *workload) { w.HopTimeout = 400 * time.Millisecond }),
		mk("50 concurrent", func(w *workload) { w.Concurrency = 50; w.Requests = reqs * 2 }),
		mk("50 concurrent, no proxy (every hop passes cancellation on)", func(w *workload) {
			w.Concurrency = 50
			w.Requests = reqs * 2
			w.Detached = false
		}),
		mk("50 concurrent, depth 6, deadline 100ms, S1 sleeps 50ms", func(w *workload) {
			w.Concurrency = 50
			w.Requests = reqs * 2
			w.Depth = 6
			w.CallerDeadline = 100 * time.Millisecond
			w.HopWork = 50 * time.Millisecond
		}),
		mk("detached proxy queues 50ms", func(w *workload) { w.ProxyDelay = 50 * time.Millisecond }),
		mk("detached proxy queues 300ms", func(w *workload) { w.ProxyDelay = 300 * time.Millisecond }),
		mk("detached proxy queues 300ms, deadline 3s", func(w *workload) {
			w.ProxyDelay = 300 * time.Millisecond
			w.CallerDeadline = 3 * time.Second
		}),
		mk("caller cancels at 1s, no deadline (outside the claim)", func(w *workload) { w.CancelOnly = true }),
	}
}

type entry struct {
	Workload workload  `json:"workload"`
	Runs     []outcome `json:"runs"`
}

func main() {
	asJSON := flag.Bool("json", false, "print JSON")
	reqs := flag.Int("requests", 100, "requests per workload (50-concurrent ones: twice)")
	only := flag.String("only", "", "run only workloads whose name contains this")
	seed := flag.Uint64("seed", 1, "seed")
	burn := flag.Int("burn", 0, "goroutines that spin on the CPU while the workloads run (a loaded machine)")
	flag.Parse()
	var stop atomic.Bool
	defer stop.Store(true)
	for range *burn {
		go func() {
			for x := 0; !stop.Load(); x++ {
				_ = x * x
			}
		}()
	}
	var out struct {
		Load    []string `json:"loadavg_before_after"`
		Entries []entry  `json:"workloads"`
	}
	out.Load = append(out.Load, loadavg())
	for _, wl := range workloads(*reqs) {
		if *only != "" && !strings.Contains(wl.Name, *only) {
			continue
		}
		wl.DeadlineMs, wl.DistName = wl.CallerDeadline.Milliseconds(), wl.Dist.name
		wl.AttemptTOms, wl.HopWorkMs, wl.HopTimeoutMs = wl.AttemptTimeout.Milliseconds(), wl.HopWork.Milliseconds(), wl.HopTimeout.Milliseconds()
		wl.ProxyDelayMs = wl.ProxyDelay.Milliseconds()
		e := entry{Workload: wl}
		for _, p := range []bool{false, true} {
			o := run(wl, p, *seed)
			e.Runs = append(e.Runs, o)
			fmt.Fprintf(os.Stderr, "%-55s prop=%-5v ok=%3d att=%4d late=%4d maxLate=%8.1fms closest=%8.1fms dlPast=%d/%.1fms wake=%.1fms busy=%7.2fs busyAfter=%7.2fs refused=%d/%d wouldFinish=%.2f inflight=%d wall=%.1fs load=%s\n",
				wl.Name, p, o.CallerOK, o.BottomAttempts, o.EndedAfterGiveUp, o.MaxLatenessMs, o.ClosestMs, o.DeadlinePastGiveUp, o.MaxDeadlinePastMs, o.MaxWakeAfterOwnDLms, o.BusySeconds, o.BusyAfterGiveUp,
				o.RefusedAtBottomHop, o.RefusedAnyHop, o.RefusedWouldFinish, o.StillInflight, o.WallSeconds, loadavg())
		}
		out.Entries = append(out.Entries, e)
	}
	out.Load = append(out.Load, loadavg())
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
	}
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:3], " ")
}
