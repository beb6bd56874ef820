// Command hedgecheck checks the hedging claim of docs/guide-hedging.md on
// workloads the hedging matrix (bench.HedgeMatrix) does not use: open-loop
// Poisson arrivals instead of closed-loop workers, a Pareto tail, a bimodal
// server at a low request rate, an M/M/c queueing server whose in-service
// work cannot be canceled (so extra copies slow everyone), a load surge on
// it, and a step to "slow for everyone" after a normal phase.
//
// Peers, each through an http.Client over loopback, every request with a
// 1 s deadline:
//
//   - none: the bare base transport, no hedging;
//   - retryhttp-auto: retryhttp's defaults with HedgeQuantile 0.95 (the
//     claim's configuration: HedgeRatio 5%, MaxHedges 1);
//   - retryhttp-p95: retryhttp with HedgeDelay at the p95 measured by
//     "none" (separates the automatic delay from the hedge share);
//   - failsafe-p95: failsafe-go's hedgepolicy.NewWithDelay at the p95
//     measured by "none" in the same seed (its docs, after "The Tail at
//     Scale", recommend the p95 or p99 as the delay);
//   - failsafe-auto: hedgepolicy.NewWithDelayQuantile(0.95, 100, 20), its
//     own running p95.
//
// "none" runs first, alone; the hedging peers then run at the same time,
// each with its own server and client. Run one workload at a time (each
// under about two minutes with 3 seeds):
//
//	cd lab/bench && go run ./cmd/hedgecheck -workload pareto -seeds 3
//	cd lab/bench && go run ./cmd/hedgecheck -list
//	cd lab/bench && go run ./cmd/hedgecheck -workload all -seeds 3 -json > /tmp/hedgecheck.json
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/lab/bench"
)

const ms = time.Millisecond

// dist is a service-time distribution.
type dist struct {
	Kind string `json:"kind"` // pareto, bimodal, exp, uniform
	// pareto: scale Xm, shape Alpha, capped at Max.
	Xm    time.Duration `json:"xm,omitempty"`
	Alpha float64       `json:"alpha,omitempty"`
	Max   time.Duration `json:"max,omitempty"`
	// bimodal: uniform in [Lo, Hi], or Slow with probability SlowShare.
	// uniform: uniform in [Lo, Hi].
	Lo        time.Duration `json:"lo,omitempty"`
	Hi        time.Duration `json:"hi,omitempty"`
	Slow      time.Duration `json:"slow,omitempty"`
	SlowShare float64       `json:"slow_share,omitempty"`
	// exp: exponential with mean Mean.
	Mean time.Duration `json:"mean,omitempty"`
}

func (d dist) draw(r *rand.Rand) time.Duration {
	switch d.Kind {
	case "pareto":
		x := float64(d.Xm) / math.Pow(1-r.Float64(), 1/d.Alpha)
		return min(time.Duration(x), d.Max)
	case "bimodal":
		if r.Float64() < d.SlowShare {
			return d.Slow
		}
		return d.Lo + time.Duration(r.Int64N(int64(d.Hi-d.Lo)+1))
	case "uniform":
		return d.Lo + time.Duration(r.Int64N(int64(d.Hi-d.Lo)+1))
	case "exp":
		return time.Duration(r.ExpFloat64() * float64(d.Mean))
	}
	panic("hedgecheck: unknown distribution " + d.Kind)
}

// phase is a stretch of a run: the arrival rate and the service time.
type phase struct {
	Name    string        `json:"name"`
	For     time.Duration `json:"for"`
	Rate    float64       `json:"rate"` // requests a second, Poisson
	Service dist          `json:"service"`
}

// workload is one cell of the check.
type workload struct {
	Name  string `json:"name"`
	Proto string `json:"proto"` // http1 or h2c
	// Servers, if > 0, makes the server a FIFO queue with that many
	// servers (M/M/c-like): a copy canceled while queued leaves the queue,
	// a copy in service runs to completion. 0: every copy is served at
	// once (infinitely many servers) and stops when canceled.
	Servers int     `json:"servers"`
	Phases  []phase `json:"phases"`
	// DelayPhase is the phase whose p95 without hedging is the fixed delay.
	DelayPhase int `json:"delay_phase"`
	// Sequential runs the hedging peers one after the other: a load
	// workload whose four copies at once would saturate the client's CPU.
	Sequential bool   `json:"sequential,omitempty"`
	Note       string `json:"note"`
	// Over counts the requests slower than this (the tail left uncut).
	Over time.Duration `json:"over,omitempty"`
}

const deadline = time.Second

func workloads() []workload {
	pareto := dist{Kind: "pareto", Xm: 2 * ms, Alpha: 1.3, Max: 2 * time.Second}
	bimodal := dist{Kind: "bimodal", Lo: 4 * ms, Hi: 6 * ms, Slow: 100 * ms, SlowShare: 0.02}
	mm := dist{Kind: "exp", Mean: 5 * ms}
	slow := dist{Kind: "uniform", Lo: 60 * ms, Hi: 70 * ms}
	return []workload{
		{Name: "pareto", Proto: "http1", Phases: []phase{{"all", 8 * time.Second, 250, pareto}},
			Over: 100 * ms, Note: "Pareto xm 2ms alpha 1.3 (cap 2s), 250 req/s Poisson, HTTP/1.1; over = slower than 100ms"},
		{Name: "pareto-h2c", Proto: "h2c", Phases: []phase{{"all", 8 * time.Second, 250, pareto}},
			Over: 100 * ms, Note: "as pareto, over h2c (one connection)"},
		{Name: "bimodal-lowrate", Proto: "http1", Phases: []phase{{"all", 18 * time.Second, 40, bimodal}},
			Over: 50 * ms, Note: "98% U[4,6]ms, 2% 100ms (20x), 40 req/s Poisson, HTTP/1.1; over = slower than 50ms"},
		{Name: "queue", Proto: "http1", Servers: 4, Sequential: true, Phases: []phase{{"all", 6 * time.Second, 660, mm}},
			Note: "M/M/4, exp service mean 5ms (capacity 800/s), 660 req/s (rho 0.83) for 6s; in-service work not cancelable"},
		{Name: "queue-surge", Proto: "http1", Servers: 4, Sequential: true, Phases: []phase{
			{"normal", 2500 * ms, 480, mm}, {"surge", 4 * time.Second, 760, mm}, {"after", 1500 * ms, 480, mm}},
			Note: "M/M/4 as queue: 480/s (rho 0.6) for 2.5s, 760/s (rho 0.95) for 4s, 480/s for 1.5s; fixed delay = p95 of the normal phase"},
		{Name: "step-slow", Proto: "h2c", Phases: []phase{
			{"normal", 3 * time.Second, 250, pareto}, {"slow", 5 * time.Second, 250, slow}},
			Note: "Pareto as pareto for 3s, then every copy 60-70ms for 5s, 250 req/s, h2c; fixed delay = p95 of the normal phase"},
	}
}

// ---- server ----

type server struct {
	*httptest.Server
	received, served, wasted atomic.Int64
	busy                     atomic.Int64 // ns of service
	waited                   atomic.Int64 // ns in the queue, of the copies served
}

func newServer(w workload, seed uint64, start *atomic.Int64) *server {
	s := &server{}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 11))
	var slots chan struct{}
	if w.Servers > 0 {
		slots = make(chan struct{}, w.Servers)
	}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		s.received.Add(1)
		elapsed := time.Duration(time.Now().UnixNano() - start.Load())
		ph := phaseAt(w.Phases, elapsed)
		mu.Lock()
		d := w.Phases[ph].Service.draw(rng)
		mu.Unlock()
		if slots != nil {
			queued := time.Now()
			select {
			case slots <- struct{}{}:
				s.waited.Add(int64(time.Since(queued)))
			case <-r.Context().Done():
				return // left the queue
			}
			time.Sleep(d) // work in service cannot be canceled
			<-slots
			s.served.Add(1)
			s.busy.Add(int64(d))
			if r.Context().Err() != nil {
				s.wasted.Add(1)
				return
			}
			io.WriteString(rw, "ok")
			return
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			s.served.Add(1)
			io.WriteString(rw, "ok")
		case <-r.Context().Done():
		}
	}))
	if w.Proto == "h2c" {
		s.Config.Protocols = new(http.Protocols)
		s.Config.Protocols.SetHTTP1(true)
		s.Config.Protocols.SetUnencryptedHTTP2(true)
	}
	s.Start()
	return s
}

func phaseAt(ps []phase, t time.Duration) int {
	for i, p := range ps {
		if t < p.For {
			return i
		}
		t -= p.For
	}
	return len(ps) - 1
}

// ---- client side ----

// counting counts the copies each request sends and when the first two go.
type counting struct {
	base   http.RoundTripper
	copies []atomic.Int32
	first  []atomic.Int64
	second []atomic.Int64
}

func (c *counting) RoundTrip(req *http.Request) (*http.Response, error) {
	if i, err := strconv.Atoi(req.Header.Get("X-Req")); err == nil && i >= 0 && i < len(c.copies) {
		now := time.Now().UnixNano()
		switch c.copies[i].Add(1) {
		case 1:
			c.first[i].Store(now)
		case 2:
			c.second[i].Store(now)
		}
	}
	return c.base.RoundTrip(req)
}

type peer struct {
	name      string
	retryhttp bool
	new       func(base http.RoundTripper, delay time.Duration) http.RoundTripper
}

func peers() []peer {
	return []peer{
		{"none", false, func(b http.RoundTripper, _ time.Duration) http.RoundTripper { return b }},
		{"retryhttp-auto", true, func(b http.RoundTripper, _ time.Duration) http.RoundTripper {
			return &retryhttp.Transport{Base: b, Policy: retryhttp.Policy{HedgeQuantile: 0.95}}
		}},
		{"retryhttp-p95", true, func(b http.RoundTripper, d time.Duration) http.RoundTripper {
			return &retryhttp.Transport{Base: b, Policy: retryhttp.Policy{HedgeDelay: d}}
		}},
		{"failsafe-p95", false, func(b http.RoundTripper, d time.Duration) http.RoundTripper {
			return failsafehttp.NewRoundTripper(b, hedgepolicy.NewWithDelay[*http.Response](d))
		}},
		{"failsafe-auto", false, func(b http.RoundTripper, _ time.Duration) http.RoundTripper {
			return failsafehttp.NewRoundTripper(b, hedgepolicy.NewWithDelayQuantile[*http.Response](0.95, 100, 20))
		}},
	}
}

type sample struct {
	start   time.Duration // since the run's start
	latency time.Duration
	failed  bool
	refused int  // retryhttp: hedges due and not sent
	won     bool // retryhttp: a hedge's answer won
}

// phaseResult is one peer's numbers over one phase (or "all").
type phaseResult struct {
	Workload string  `json:"workload"`
	Peer     string  `json:"peer"`
	Seed     uint64  `json:"seed"`
	Phase    string  `json:"phase"`
	DelayMs  float64 `json:"delay_ms"`
	Requests int     `json:"requests"`
	Failed   int     `json:"failed"`
	P50      float64 `json:"p50_ms"`
	P95      float64 `json:"p95_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p999_ms"`
	Mean     float64 `json:"mean_ms"`
	Copies   float64 `json:"copies_per_request"`
	// HedgeAtMs is the median time from a request's first copy to its
	// second, over the hedged requests: the delay actually used.
	HedgeAtMs float64 `json:"hedge_at_ms"`
	Hedged    float64 `json:"hedged_share"`
	Refused   float64 `json:"refused_per_request"`
	Won       float64 `json:"won_share"`  // retryhttp only
	Over      int     `json:"over_count"` // requests slower than the workload's Over
	// OverAtS is when (s into the run) each of those started.
	OverAtS []float64 `json:"over_at_s,omitempty"`
	// Whole-run server numbers (phase "all" only).
	ServedPerSec float64 `json:"served_per_sec,omitempty"`
	WastedShare  float64 `json:"wasted_share,omitempty"`
	Utilization  float64 `json:"utilization,omitempty"`
	QueueWaitMs  float64 `json:"queue_wait_ms,omitempty"` // mean, over the copies served
	GoodPerSec   float64 `json:"good_per_sec,omitempty"`
}

func runOnce(w workload, p peer, delay time.Duration, seed uint64) []phaseResult {
	var startNs atomic.Int64
	startNs.Store(math.MaxInt64 / 2)
	srv := newServer(w, seed, &startNs)
	defer srv.Close()
	base := &http.Transport{MaxIdleConnsPerHost: 512}
	if w.Proto == "h2c" {
		base.Protocols = new(http.Protocols)
		base.Protocols.SetUnencryptedHTTP2(true)
	}
	defer base.CloseIdleConnections()
	var total time.Duration
	var expect float64
	for _, ph := range w.Phases {
		total += ph.For
		expect += ph.Rate * ph.For.Seconds()
	}
	n := int(expect*1.5) + 1000
	cb := &counting{base: base, copies: make([]atomic.Int32, n), first: make([]atomic.Int64, n), second: make([]atomic.Int64, n)}
	client := &http.Client{Transport: p.new(cb, delay)}

	samples := make([]sample, n)
	arrivals := rand.New(rand.NewPCG(seed, 3))
	var wg sync.WaitGroup
	start := time.Now()
	startNs.Store(start.UnixNano())
	next := time.Duration(0)
	made := 0
	for made < n {
		ph := phaseAt(w.Phases, next)
		next += time.Duration(arrivals.ExpFloat64() / w.Phases[ph].Rate * float64(time.Second))
		if next >= total {
			break
		}
		if d := next - time.Since(start); d > 0 {
			time.Sleep(d)
		}
		i := made
		made++
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), deadline)
			defer cancel()
			var rep retryhttp.Report
			if p.retryhttp {
				ctx = retryhttp.WithReport(ctx, &rep)
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
			req.Header.Set("X-Req", strconv.Itoa(i))
			t0 := time.Now()
			resp, err := client.Do(req)
			failed := err != nil
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				failed = err != nil || resp.StatusCode != http.StatusOK
			}
			s := sample{start: t0.Sub(start), latency: time.Since(t0), failed: failed}
			for _, a := range rep.History {
				s.refused += a.HedgesRefused
				s.won = s.won || a.HedgeWon
			}
			samples[i] = s
		})
	}
	wg.Wait()
	runFor := time.Since(start)
	srv.Close()
	samples = samples[:made]

	var out []phaseResult
	phaseOf := func(name string, keep func(sample) bool) phaseResult {
		r := phaseResult{Workload: w.Name, Peer: p.name, Seed: seed, Phase: name, DelayMs: msOf(delay)}
		var lat []time.Duration
		var sent, hedged, refused, won int
		var hedgeAt []time.Duration
		var sum time.Duration
		for i, s := range samples {
			if !keep(s) {
				continue
			}
			lat = append(lat, s.latency)
			sum += s.latency
			c := int(cb.copies[i].Load())
			sent += c
			if c > 1 {
				hedged++
				hedgeAt = append(hedgeAt, time.Duration(cb.second[i].Load()-cb.first[i].Load()))
			}
			refused += s.refused
			if s.won {
				won++
			}
			if w.Over > 0 && s.latency > w.Over {
				r.Over++
				r.OverAtS = append(r.OverAtS, round3(s.start.Seconds()))
			}
			if s.failed {
				r.Failed++
			}
		}
		if len(lat) == 0 {
			return r
		}
		slices.Sort(lat)
		q := func(p float64) float64 { return msOf(lat[min(len(lat)-1, int(p*float64(len(lat))))]) }
		r.Requests = len(lat)
		r.P50, r.P95, r.P99, r.P999 = q(0.5), q(0.95), q(0.99), q(0.999)
		r.Mean = round3(msOf(sum) / float64(len(lat)))
		r.Copies = round3(float64(sent) / float64(len(lat)))
		r.Hedged = round3(float64(hedged) / float64(len(lat)))
		r.Refused = round3(float64(refused) / float64(len(lat)))
		r.Won = round3(float64(won) / float64(len(lat)))
		if len(hedgeAt) > 0 {
			slices.Sort(hedgeAt)
			r.HedgeAtMs = msOf(hedgeAt[len(hedgeAt)/2])
		}
		return r
	}
	all := phaseOf("all", func(sample) bool { return true })
	all.ServedPerSec = round3(float64(srv.served.Load()) / runFor.Seconds())
	if sv := srv.served.Load(); sv > 0 {
		all.WastedShare = round3(float64(srv.wasted.Load()) / float64(sv))
		all.QueueWaitMs = msOf(time.Duration(srv.waited.Load() / sv))
	}
	if w.Servers > 0 {
		all.Utilization = round3(float64(srv.busy.Load()) / float64(time.Duration(w.Servers)*runFor))
	}
	all.GoodPerSec = round3(float64(all.Requests-all.Failed) / runFor.Seconds())
	out = append(out, all)
	if len(w.Phases) > 1 {
		var from time.Duration
		for _, ph := range w.Phases {
			lo, hi := from, from+ph.For
			out = append(out, phaseOf(ph.Name, func(s sample) bool { return s.start >= lo && s.start < hi }))
			from = hi
		}
	}
	return out
}

func msOf(d time.Duration) float64 { return round3(float64(d) / float64(ms)) }
func round3(x float64) float64     { return math.Round(x*1000) / 1000 }

// runWorkload runs "none" first (its p95 over DelayPhase is the fixed
// delay), then every hedging peer at once.
func runWorkload(w workload, ps []peer, seeds int, sequential bool, progress io.Writer) []phaseResult {
	var out []phaseResult
	for s := 1; s <= seeds; s++ {
		seed := uint64(s)
		none := runOnce(w, ps[0], 0, seed)
		out = append(out, none...)
		idx := 0
		if len(w.Phases) > 1 {
			idx = 1 + w.DelayPhase
		}
		delay := time.Duration(none[idx].P95 * float64(ms))
		fmt.Fprintf(progress, "%s seed %d: none p95 %.2f ms (fixed delay), p99.9 %.1f ms\n", w.Name, seed, none[idx].P95, none[0].P999)
		res := make([][]phaseResult, len(ps)-1)
		var wg sync.WaitGroup
		for i, p := range ps[1:] {
			if sequential {
				res[i] = runOnce(w, p, delay, seed)
				continue
			}
			wg.Go(func() { res[i] = runOnce(w, p, delay, seed) })
		}
		wg.Wait()
		for _, r := range res {
			out = append(out, r...)
			fmt.Fprintf(progress, "  %-15s p99 %7.1f p99.9 %7.1f copies %.3f failed %d\n", r[0].Peer, r[0].P99, r[0].P999, r[0].Copies, r[0].Failed)
		}
	}
	return out
}

// ---- report ----

type summary struct {
	Workload, Peer, Phase string
	Median                phaseResult
	P999Min, P999Max      float64
	CopiesMin, CopiesMax  float64
}

func summarise(rs []phaseResult) []summary {
	type key struct{ w, p, ph string }
	var out []summary
	for _, g := range bench.GroupInOrder(rs, func(r phaseResult) key { return key{r.Workload, r.Peer, r.Phase} }) {
		k := key{g[0].Workload, g[0].Peer, g[0].Phase}
		f := func(get func(phaseResult) float64) float64 {
			xs := make([]float64, len(g))
			for i, r := range g {
				xs[i] = get(r)
			}
			return float64(bench.StatOf(xs).Median)
		}
		m := phaseResult{Workload: k.w, Peer: k.p, Phase: k.ph,
			DelayMs:      f(func(r phaseResult) float64 { return r.DelayMs }),
			Requests:     int(f(func(r phaseResult) float64 { return float64(r.Requests) })),
			Failed:       int(f(func(r phaseResult) float64 { return float64(r.Failed) })),
			P50:          f(func(r phaseResult) float64 { return r.P50 }),
			P95:          f(func(r phaseResult) float64 { return r.P95 }),
			P99:          f(func(r phaseResult) float64 { return r.P99 }),
			P999:         f(func(r phaseResult) float64 { return r.P999 }),
			Mean:         f(func(r phaseResult) float64 { return r.Mean }),
			Copies:       f(func(r phaseResult) float64 { return r.Copies }),
			HedgeAtMs:    f(func(r phaseResult) float64 { return r.HedgeAtMs }),
			Hedged:       f(func(r phaseResult) float64 { return r.Hedged }),
			Refused:      f(func(r phaseResult) float64 { return r.Refused }),
			Won:          f(func(r phaseResult) float64 { return r.Won }),
			Over:         int(f(func(r phaseResult) float64 { return float64(r.Over) })),
			ServedPerSec: f(func(r phaseResult) float64 { return r.ServedPerSec }),
			WastedShare:  f(func(r phaseResult) float64 { return r.WastedShare }),
			Utilization:  f(func(r phaseResult) float64 { return r.Utilization }),
			QueueWaitMs:  f(func(r phaseResult) float64 { return r.QueueWaitMs }),
			GoodPerSec:   f(func(r phaseResult) float64 { return r.GoodPerSec }),
		}
		s := summary{Workload: k.w, Peer: k.p, Phase: k.ph, Median: m, P999Min: math.Inf(1), CopiesMin: math.Inf(1)}
		for _, r := range g {
			s.P999Min, s.P999Max = min(s.P999Min, r.P999), max(s.P999Max, r.P999)
			s.CopiesMin, s.CopiesMax = min(s.CopiesMin, r.Copies), max(s.CopiesMax, r.Copies)
		}
		out = append(out, s)
	}
	return out
}

func printTable(w io.Writer, ws []workload, sums []summary) {
	fmt.Fprintln(w, "| workload | phase | peer | delay (ms) | p50 | p99 | p99.9 [min-max] | mean | copies/req [min-max] | hedged | won | hedge sent at (ms) | refused/req | over | failed | served/s | wasted | util | queue wait | good/s |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, s := range sums {
		m := s.Median
		delay := fmt.Sprintf("%.2f", m.DelayMs)
		switch {
		case s.Peer == "none":
			delay = fmt.Sprintf("(p95 %.2f)", m.P95)
		case strings.HasSuffix(s.Peer, "-auto"):
			delay = "auto"
		}
		srv := "| | | | | |"
		if s.Phase == "all" {
			srv = fmt.Sprintf("| %.0f | %.3f | %.3f | %.1f | %.0f |", m.ServedPerSec, m.WastedShare, m.Utilization, m.QueueWaitMs, m.GoodPerSec)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %.1f | %.1f | %.1f [%.1f-%.1f] | %.1f | %.3f [%.3f-%.3f] | %.3f | %.3f | %.1f | %.3f | %d | %d %s\n",
			s.Workload, s.Phase, s.Peer, delay, m.P50, m.P99, m.P999, s.P999Min, s.P999Max, m.Mean,
			m.Copies, s.CopiesMin, s.CopiesMax, m.Hedged, m.Won, m.HedgeAtMs, m.Refused, m.Over, m.Failed, srv)
	}
}

func main() {
	name := flag.String("workload", "", "workload to run (\"all\" for every one); see -list")
	seeds := flag.Int("seeds", 3, "seeds (1..n); medians are reported")
	asJSON := flag.Bool("json", false, "print results and summaries as JSON")
	list := flag.Bool("list", false, "list the workloads")
	peerRE := flag.String("peers", "", "run only the hedging peers whose names match this regexp (\"none\" always runs)")
	seq := flag.Bool("sequential", false, "run the hedging peers one after the other, not at once")
	in := flag.String("in", "", "print the table of a run saved with -json instead of running")
	flag.Parse()
	ws := workloads()
	if *in != "" {
		var saved struct {
			Seeds     int           `json:"seeds"`
			Workloads []workload    `json:"workloads"`
			Results   []phaseResult `json:"results"`
		}
		b, err := os.ReadFile(*in)
		if err == nil {
			err = json.Unmarshal(b, &saved)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("Medians over %d seeds; latencies in ms; every request has a %v deadline.\n\n", saved.Seeds, deadline)
		printTable(os.Stdout, saved.Workloads, summarise(saved.Results))
		return
	}
	if *list || *name == "" {
		for _, w := range ws {
			fmt.Printf("%-16s %s\n", w.Name, w.Note)
		}
		return
	}
	var chosen []workload
	for _, w := range ws {
		if *name == "all" || w.Name == *name {
			chosen = append(chosen, w)
		}
	}
	if len(chosen) == 0 {
		fmt.Fprintln(os.Stderr, "hedgecheck: no workload", *name)
		os.Exit(2)
	}
	var results []phaseResult
	t0 := time.Now()
	for _, w := range chosen {
		fmt.Fprintf(os.Stderr, "== %s: %s\n", w.Name, w.Note)
		ps := peers()
		if *peerRE != "" {
			re, err := regexp.Compile(*peerRE)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			ps = slices.DeleteFunc(ps, func(p peer) bool { return p.name != "none" && !re.MatchString(p.name) })
		}
		results = append(results, runWorkload(w, ps, *seeds, *seq || w.Sequential, os.Stderr)...)
	}
	fmt.Fprintf(os.Stderr, "wall time %v\n", time.Since(t0).Round(time.Second))
	sums := summarise(results)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", " ")
		enc.Encode(map[string]any{"workloads": chosen, "seeds": *seeds, "deadline": deadline.String(), "results": results, "summaries": sums})
		return
	}
	fmt.Printf("Medians over %d seeds; latencies in ms; every request has a %v deadline.\n\n", *seeds, deadline)
	printTable(os.Stdout, chosen, sums)
}
