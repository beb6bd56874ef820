// Command timeoutcheck checks the claim of Policy.AttemptTimeoutQuantile
// (issue 35, docs/design.md §16) on workloads the authors did not tune
// on: with AttemptTimeoutQuantile 0.999 under an AttemptTimeout of 2s,
// false timeouts (attempts cut that would have answered) stay within
// twice the chosen rate, 0.2%, in every regime, and the median hung
// attempt is cut within twice the p99.9 of the regime it is in.
//
// Each workload runs a real retryhttp.Transport against httptest loopback
// servers, once per seed, with a new Transport and servers each time; the
// counts are summed over the seeds.
//
//	go run . -json results.json > results.txt
//	go run . -only drift            # the workloads whose name holds "drift"
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/herdproof/retryhttp"
)

const (
	quantile = 0.999
	ceiling  = 2 * time.Second
	// The goals of issue 35.
	maxFalseRate = 2 * (1 - quantile)
	maxHoldRatio = 2.0
	// minHungJudged is the fewest hung attempts whose median is judged.
	minHungJudged = 10
)

// dist draws a latency in ms.
type dist struct {
	Name string `json:"name"`
	draw func(r *rand.Rand) float64
}

// lognormal has that median and p99.9, in ms.
func lognormal(median, p999 float64) dist {
	sigma := math.Log(p999/median) / 3.0902
	return dist{fmt.Sprintf("lognormal median %gms p99.9 %gms (sigma %.2f)", median, p999, sigma),
		func(r *rand.Rand) float64 { return median * math.Exp(sigma*r.NormFloat64()) }}
}

// lognormalSigma has that median and sigma, in ms.
func lognormalSigma(median, sigma float64) dist {
	return dist{fmt.Sprintf("lognormal median %gms sigma %g (p99.9 %.0fms)", median, sigma, median*math.Exp(sigma*3.0902)),
		func(r *rand.Rand) float64 { return median * math.Exp(sigma*r.NormFloat64()) }}
}

// pareto has scale xm ms and shape alpha.
func pareto(xm, alpha float64) dist {
	return dist{fmt.Sprintf("Pareto xm %gms alpha %g (p99.9 %.0fms)", xm, alpha, xm*math.Pow(1000, 1/alpha)),
		func(r *rand.Rand) float64 { return xm * math.Pow(1-r.Float64(), -1/alpha) }}
}

// bimodal is fast with share 1-slow, else slow; each mode lognormal of
// sigma 0.15 around its median.
func bimodal(fast, slow, slowShare float64) dist {
	return dist{fmt.Sprintf("bimodal %g%% ~%gms, %g%% ~%gms (sigma 0.15 each)", 100*(1-slowShare), fast, 100*slowShare, slow),
		func(r *rand.Rand) float64 {
			m := fast
			if r.Float64() < slowShare {
				m = slow
			}
			return m * math.Exp(0.15*r.NormFloat64())
		}}
}

// regime is a stretch of requests [From, To) to one host, drawn from Dist
// scaled linearly from Scale[0] at From to Scale[1] at To.
type regime struct {
	Name    string
	Host    int
	Dist    dist
	From    int
	To      int
	Scale   [2]float64
	Counted bool // false for a warm-up: the ceiling serves until a window is measured
}

func (r *regime) scale(id int) float64 {
	if r.Scale == [2]float64{} {
		return 1
	}
	return r.Scale[0] + (r.Scale[1]-r.Scale[0])*float64(id-r.From)/float64(r.To-r.From)
}

type workload struct {
	Name        string
	Concurrency int
	HangEvery   int
	Hosts       int  // request id % Hosts goes to that host
	PerHost     bool // Transport.PerHost, else one estimator for all hosts
	Regimes     []regime
	// Aggregate rows: a name and the regimes pooled in it.
	Pools []pool
}

type pool struct {
	Name    string
	Regimes []int
}

// phases builds regimes back to back for one host.
type phaseSpec struct {
	name    string
	d       dist
	n       int
	scale   [2]float64
	counted bool
}

func serial(host, hosts int, specs ...phaseSpec) []regime {
	var rs []regime
	from := 0
	for _, s := range specs {
		to := from + s.n*hosts
		rs = append(rs, regime{Name: s.name, Host: host, Dist: s.d, From: from, To: to, Scale: s.scale, Counted: s.counted})
		from = to
	}
	return rs
}

func workloads() []workload {
	k := 1000
	base := lognormal(5, 60)
	return []workload{
		{Name: "slow base x3 step (128 callers)", Concurrency: 128, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: lognormal(20, 200), n: k},
				phaseSpec{name: "20/200ms", d: lognormal(20, 200), n: 14 * k, counted: true},
				phaseSpec{name: "60/600ms", d: lognormal(60, 600), n: 14 * k, counted: true},
				phaseSpec{name: "20/200ms again", d: lognormal(20, 200), n: 14 * k, counted: true})},
		{Name: "gradual drift x10 over 20k requests", Concurrency: 64, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: base, n: 2 * k},
				phaseSpec{name: "drift x1->x3.25", d: base, n: 5 * k, scale: [2]float64{1, 3.25}, counted: true},
				phaseSpec{name: "drift x3.25->x5.5", d: base, n: 5 * k, scale: [2]float64{3.25, 5.5}, counted: true},
				phaseSpec{name: "drift x5.5->x7.75", d: base, n: 5 * k, scale: [2]float64{5.5, 7.75}, counted: true},
				phaseSpec{name: "drift x7.75->x10", d: base, n: 5 * k, scale: [2]float64{7.75, 10}, counted: true}),
			Pools: []pool{{"whole drift", []int{1, 2, 3, 4}}}},
		{Name: "bimodal 3ms/40ms", Concurrency: 64, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: bimodal(3, 40, 0.05), n: k},
				phaseSpec{name: "5% slow", d: bimodal(3, 40, 0.05), n: 14 * k, counted: true},
				phaseSpec{name: "0.5% slow", d: bimodal(3, 40, 0.005), n: 14 * k, counted: true})},
		{Name: "light load (4 callers)", Concurrency: 4, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: lognormal(2, 20), n: k},
				phaseSpec{name: "2/20ms", d: lognormal(2, 20), n: 14 * k, counted: true})},
		{Name: "heavy load (256 callers), 5/60 -> 50/500", Concurrency: 256, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: base, n: k},
				phaseSpec{name: "5/60ms", d: base, n: 14 * k, counted: true},
				phaseSpec{name: "50/500ms", d: lognormal(50, 500), n: 14 * k, counted: true})},
		{Name: "Pareto tail alpha 1.5", Concurrency: 64, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: pareto(1, 1.5), n: k},
				phaseSpec{name: "pareto", d: pareto(1, 1.5), n: 14 * k, counted: true})},
		{Name: "lognormal sigma 1.5", Concurrency: 64, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: lognormalSigma(2, 1.5), n: k},
				phaseSpec{name: "sigma 1.5", d: lognormalSigma(2, 1.5), n: 14 * k, counted: true})},
		{Name: "hangs 1 in 5000", Concurrency: 64, HangEvery: 5000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: base, n: k},
				phaseSpec{name: "5/60ms", d: base, n: 35 * k, counted: true})},
		twoHosts(true),
		twoHosts(false),
	}
}

// stress are workloads past the ones above, chosen from the estimator's
// rules to find where the goals break: spells shorter than its window, a
// larger step, a hang rate near 1-q, and latencies near the timer floor.
func stress() []workload {
	k := 1000
	fast, slow := lognormal(5, 60), lognormal(50, 500)
	square := func(half, cycles int) workload {
		specs := []phaseSpec{{name: "warm-up", d: fast, n: 2 * k}}
		for range cycles {
			specs = append(specs, phaseSpec{name: "fast half", d: fast, n: half, counted: true},
				phaseSpec{name: "slow half", d: slow, n: half, counted: true})
		}
		w := workload{Name: fmt.Sprintf("square wave 5/60 <-> 50/500, %d requests a half", half), Concurrency: 64, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1, specs...)}
		w.poolByName("all fast halves", "fast half")
		w.poolByName("all slow halves", "slow half")
		return w
	}
	return []workload{
		square(2*k, 6),
		square(5*k, 2),
		{Name: "step x50: 2/20ms -> 100/1000ms -> back", Concurrency: 64, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: lognormal(2, 20), n: k},
				phaseSpec{name: "2/20ms", d: lognormal(2, 20), n: 7 * k, counted: true},
				phaseSpec{name: "100/1000ms", d: lognormal(100, 1000), n: 7 * k, counted: true},
				phaseSpec{name: "2/20ms again", d: lognormal(2, 20), n: 7 * k, counted: true})},
		{Name: "hangs 1 in 1000 (= 1-q)", Concurrency: 64, HangEvery: 1000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: fast, n: k},
				phaseSpec{name: "5/60ms", d: fast, n: 10 * k, counted: true})},
		{Name: "hangs 1 in 500 (> 1-q)", Concurrency: 64, HangEvery: 500, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: fast, n: k},
				phaseSpec{name: "5/60ms", d: fast, n: 10 * k, counted: true})},
		{Name: "hangs 1 in 100 (10x 1-q)", Concurrency: 64, HangEvery: 100, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: fast, n: k},
				phaseSpec{name: "5/60ms", d: fast, n: 5 * k, counted: true})},
		{Name: "step x10 at 16 callers: 5/60 -> 50/500, 3000 requests each", Concurrency: 16, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: fast, n: k},
				phaseSpec{name: "5/60ms", d: fast, n: 3 * k, counted: true},
				phaseSpec{name: "50/500ms", d: slow, n: 3 * k, counted: true})},
		{Name: "sub-millisecond 0.5/5ms", Concurrency: 64, HangEvery: 2000, Hosts: 1,
			Regimes: serial(0, 1,
				phaseSpec{name: "warm-up", d: lognormal(0.5, 5), n: k},
				phaseSpec{name: "0.5/5ms", d: lognormal(0.5, 5), n: 14 * k, counted: true})},
	}
}

// poolByName adds a pool of the regimes of that name.
func (w *workload) poolByName(poolName, name string) {
	p := pool{Name: poolName}
	for i, r := range w.Regimes {
		if r.Name == name {
			p.Regimes = append(p.Regimes, i)
		}
	}
	w.Pools = append(w.Pools, p)
}

func twoHosts(perHost bool) workload {
	name := "two hosts 2/20ms and 30/300ms, PerHost"
	if !perHost {
		name = "two hosts 2/20ms and 30/300ms, one Transport estimator (control)"
	}
	k := 1000
	a := serial(0, 2, phaseSpec{name: "A warm-up", d: lognormal(2, 20), n: k},
		phaseSpec{name: "host A 2/20ms", d: lognormal(2, 20), n: 14 * k, counted: true})
	b := serial(1, 2, phaseSpec{name: "B warm-up", d: lognormal(30, 300), n: k},
		phaseSpec{name: "host B 30/300ms", d: lognormal(30, 300), n: 14 * k, counted: true})
	return workload{Name: name, Concurrency: 64, HangEvery: 2000, Hosts: 2, PerHost: perHost,
		Regimes: []regime{a[0], b[0], a[1], b[1]}}
}

func (w *workload) total() int {
	n := 0
	for _, r := range w.Regimes {
		n = max(n, r.To)
	}
	return n
}

func (w *workload) regimeOf(id int) int {
	h := id % w.Hosts
	for i, r := range w.Regimes {
		if r.Host == h && id >= r.From && id < r.To {
			return i
		}
	}
	panic("no regime for request " + strconv.Itoa(id))
}

// draw is the latency of attempt n of request id in ms, the same for the
// server and the bookkeeping; negative for an attempt that hangs. scale is
// the regime's scale at id.
func draw(w *workload, seed uint64, id, n int) (ms, scale float64) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d", id, n)
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	r := &w.Regimes[w.regimeOf(id)]
	scale = r.scale(id)
	if rng.IntN(w.HangEvery) == 0 {
		return -1, scale
	}
	return r.Dist.draw(rng) * scale, scale
}

// acc accumulates one regime over the seeds.
type acc struct {
	attempts, falseCuts, falseShort, hung, hungCut, failed int
	draws, norm                                            []float64 // drawn latencies, and divided by the scale
	holds, holdScale                                       []float64
	falseAt                                                []float64 // the timeout met by each false cut
	obs                                                    []float64 // the client's latency of the attempts not hung; +Inf if cut
}

func (a *acc) merge(b *acc) {
	a.attempts += b.attempts
	a.falseCuts += b.falseCuts
	a.falseShort += b.falseShort
	a.hung += b.hung
	a.hungCut += b.hungCut
	a.failed += b.failed
	a.draws = append(a.draws, b.draws...)
	a.norm = append(a.norm, b.norm...)
	a.obs = append(a.obs, b.obs...)
	a.holds = append(a.holds, b.holds...)
	a.holdScale = append(a.holdScale, b.holdScale...)
	a.falseAt = append(a.falseAt, b.falseAt...)
}

type cut struct {
	ID   int     `json:"id"`
	Ms   float64 `json:"ms"`
	Hung bool    `json:"hung"`
	// DrawMs is the latency the server drew for it; -1 for a hang.
	DrawMs float64 `json:"draw_ms"`
}

// probe, when set, receives the attempt timeout each first attempt was
// sent under, by request id, read from its Request-Timeout-Ms header.
// With a probe, runOnce also returns the stragglers: the attempts that
// ended after an attempt of a later regime had ended.
func runOnce(w *workload, seed uint64, accs []acc, probe func(id int, ms int)) ([]cut, []straggler) {
	srvs := make([]*httptest.Server, w.Hosts)
	for h := range srvs {
		srvs[h] = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
			id, _ := strconv.Atoi(r.Header.Get("X-Request-Id"))
			n, _ := strconv.Atoi(r.Header.Get("Retry-Attempt"))
			d, _ := draw(w, seed, id, n)
			if probe != nil && n == 1 {
				ms, _ := strconv.Atoi(r.Header.Get("Request-Timeout-Ms"))
				probe(id, ms)
			}
			if d < 0 {
				<-r.Context().Done()
				return
			}
			t := time.NewTimer(time.Duration(d * float64(time.Millisecond)))
			defer t.Stop()
			select {
			case <-t.C:
				io.WriteString(rw, "ok")
			case <-r.Context().Done():
			}
		}))
		defer srvs[h].Close()
	}
	// A pool as large as the callers: the default keeps GOMAXPROCS+1 idle
	// connections a host, and the churn of new ones would be noise here.
	hb := http.DefaultTransport.(*http.Transport).Clone()
	hb.MaxIdleConnsPerHost = 2 * w.Concurrency
	hb.MaxIdleConns = 0
	defer hb.CloseIdleConnections()

	var mu sync.Mutex
	var cuts []cut
	var strag []straggler
	completed, latest := 0, 0
	tr := &retryhttp.Transport{Base: hb,
		Policy: retryhttp.Policy{AttemptTimeout: ceiling, AttemptTimeoutQuantile: quantile, SendAttemptHeader: true,
			// With no deadline and no Limiter, it only sends the attempt
			// timeout in a header, for the probe.
			PropagateDeadline: probe != nil},
		OnAttempt: func(a retryhttp.Attempt) {
			id, _ := strconv.Atoi(a.Request.Header.Get("X-Request-Id"))
			d, scale := draw(w, seed, id, a.Number)
			mu.Lock()
			defer mu.Unlock()
			ri := w.regimeOf(id)
			s := &accs[ri]
			s.attempts++
			completed++
			if probe != nil {
				if ri < latest {
					strag = append(strag, straggler{completed, id, w.Regimes[ri].Name, round(float64(a.Duration)/float64(time.Millisecond), 1)})
				}
				latest = max(latest, ri)
			}
			if d >= 0 {
				s.draws = append(s.draws, d)
				s.norm = append(s.norm, d/scale)
			} else {
				s.hung++
			}
			ms := float64(a.Duration) / float64(time.Millisecond)
			timedOut := errors.Is(a.Err, retryhttp.ErrAttemptTimeout)
			if d >= 0 {
				if timedOut {
					s.obs = append(s.obs, math.Inf(1))
				} else {
					s.obs = append(s.obs, ms)
				}
			}
			if !timedOut {
				return
			}
			cuts = append(cuts, cut{id, round(ms, 2), d < 0, round(d, 2)})
			if d < 0 {
				s.hungCut++
				s.holds = append(s.holds, ms)
				s.holdScale = append(s.holdScale, scale)
			} else {
				s.falseCuts++
				s.falseAt = append(s.falseAt, ms)
				if d < ms {
					s.falseShort++
				}
			}
		}}
	if w.PerHost {
		tr.PerHost = &retryhttp.PerHost{Budget: func(string) retryhttp.Budget { return retryhttp.NewTokenBucket(math.MaxInt32) }}
	} else {
		tr.Budget = retryhttp.NewTokenBucket(math.MaxInt32)
	}
	defer tr.CloseIdleConnections()

	var wg sync.WaitGroup
	ids := make(chan int)
	for range w.Concurrency {
		wg.Go(func() {
			for id := range ids {
				req, _ := http.NewRequest("GET", srvs[id%w.Hosts].URL, nil)
				req.Header.Set("X-Request-Id", strconv.Itoa(id))
				resp, err := tr.RoundTrip(req)
				if err != nil {
					mu.Lock()
					accs[w.regimeOf(id)].failed++
					mu.Unlock()
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	for id := range w.total() {
		ids <- id
	}
	close(ids)
	wg.Wait()
	slices.SortFunc(cuts, func(a, b cut) int { return a.ID - b.ID })
	return cuts, strag
}

// A straggler is an attempt that ended after an attempt of a later regime
// had: Completion is its place in the order attempts ended in.
type straggler struct {
	Completion int     `json:"completion"`
	ID         int     `json:"id"`
	Regime     string  `json:"regime"`
	Ms         float64 `json:"ms"`
}

type row struct {
	Workload     string  `json:"workload"`
	Regime       string  `json:"regime"`
	Latency      string  `json:"latency"`
	Counted      bool    `json:"counted"` // false: a warm-up, under the ceiling
	Attempts     int     `json:"attempts"`
	TrueP999Ms   float64 `json:"true_p999_ms"` // of the drawn latencies of the attempts made
	TrueMedianMs float64 `json:"true_median_ms"`
	// The p99.9 of the attempts' latencies as the client saw them, hung
	// ones left out and cut ones counted as slower than any: the drawn
	// latency plus the loopback's, the server's and the scheduler's. -1
	// when it lies among the cut ones.
	ObservedP999Ms float64 `json:"client_observed_p999_ms"`
	FalseTimeouts  int     `json:"false_timeouts"`
	FalseRate      float64 `json:"false_timeout_rate"`
	// False cuts whose drawn latency was under the time they were cut at:
	// cut by the delays of the client, the server or the scheduler, not
	// by the latency's tail.
	FalseShort int `json:"false_timeouts_drawn_under_cut"`
	// The timeout each false cut met, median: about the timeout in force.
	FalseCutAtMedMs float64 `json:"false_cut_at_median_ms"`
	Hung            int     `json:"hung_attempts"`
	HungCut         int     `json:"hung_attempts_cut"`
	HoldMedianMs    float64 `json:"hung_hold_median_ms"`
	HoldMaxMs       float64 `json:"hung_hold_max_ms"`
	HoldOverP999    float64 `json:"hung_hold_median_over_p999"`
	// Each hold over the p99.9 at its own request (the regime's p99.9 of
	// the latencies divided by the scale, times the scale at the hung
	// attempt), median: the measure for a drift.
	HoldOverLocalP999 float64 `json:"hung_hold_over_local_p999_median"`
	Failed            int     `json:"requests_failed"`
	FalseOK           bool    `json:"false_rate_goal_met"`
	HoldOK            bool    `json:"hold_goal_met"`
	// The hold goal is judged on 10 hung attempts cut or more.
	HoldJudged bool `json:"hold_judged"`
}

type wresult struct {
	Name        string  `json:"name"`
	Concurrency int     `json:"concurrency"`
	HangEvery   int     `json:"hang_every"`
	Hosts       int     `json:"hosts"`
	PerHost     bool    `json:"per_host"`
	Rows        []row   `json:"rows"`
	WallSeconds float64 `json:"wall_seconds"`
	LoadBefore  string  `json:"loadavg_before"`
	LoadAfter   string  `json:"loadavg_after"`
	// Cuts: every attempt cut in the first seed's run, by request id.
	Cuts []cut `json:"cuts_first_seed"`
	// Timeouts: with -probe, the attempt timeout a first attempt was sent
	// under, in whole ms, by request id, for the first seed.
	Timeouts [][2]int `json:"timeouts_first_seed,omitempty"`
	// Stragglers: with -probe, the first seed's attempts that ended after
	// an attempt of a later regime (single-host workloads).
	Stragglers []straggler `json:"stragglers_first_seed,omitempty"`
}

type result struct {
	Set       string    `json:"set"`
	Quantile  float64   `json:"quantile"`
	CeilingMs float64   `json:"ceiling_ms"`
	Seeds     []uint64  `json:"seeds"`
	Go        string    `json:"go"`
	Workloads []wresult `json:"workloads"`
}

func quantileOf(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

func makeRow(w *workload, name, latency string, counted bool, a *acc) row {
	r := row{Workload: w.Name, Regime: name, Latency: latency, Counted: counted, Attempts: a.attempts,
		FalseTimeouts: a.falseCuts, FalseShort: a.falseShort, Hung: a.hung, HungCut: a.hungCut, Failed: a.failed}
	r.TrueP999Ms = round(quantileOf(a.draws, quantile), 1)
	r.TrueMedianMs = round(quantileOf(a.draws, 0.5), 2)
	r.ObservedP999Ms = round(quantileOf(a.obs, quantile), 1)
	if math.IsInf(r.ObservedP999Ms, 1) {
		r.ObservedP999Ms = -1 // among the cut ones: more than 0.1% were cut
	}
	if a.attempts > 0 {
		r.FalseRate = round(float64(a.falseCuts)/float64(a.attempts), 5)
	}
	r.FalseCutAtMedMs = round(quantileOf(a.falseAt, 0.5), 1)
	if len(a.holds) > 0 {
		r.HoldMedianMs = round(quantileOf(a.holds, 0.5), 1)
		r.HoldMaxMs = round(slices.Max(a.holds), 1)
		r.HoldOverP999 = round(r.HoldMedianMs/r.TrueP999Ms, 2)
		np := quantileOf(a.norm, quantile)
		ratios := make([]float64, len(a.holds))
		for i, h := range a.holds {
			ratios[i] = h / (np * a.holdScale[i])
		}
		r.HoldOverLocalP999 = round(quantileOf(ratios, 0.5), 2)
	}
	r.FalseOK = r.FalseRate <= maxFalseRate
	r.HoldOK = len(a.holds) > 0 && r.HoldOverLocalP999 <= maxHoldRatio
	r.HoldJudged = len(a.holds) >= minHungJudged
	return r
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

func main() {
	jsonOut := flag.String("json", "", "write the results as JSON to this file")
	only := flag.String("only", "", "run only the workloads whose name holds this")
	seed := flag.Uint64("seed", 1, "the first seed")
	nseeds := flag.Int("seeds", 3, "seeds per workload, from -seed on")
	probeOn := flag.Bool("probe", false, "send PropagateDeadline's header, to read the attempt timeout of the first seed's requests")
	probeEvery := flag.Int("probe-every", 100, "keep the probe's reading of every this many requests")
	set := flag.String("set", "claim", "the workloads: claim, or stress (past the claim, to find where it breaks)")
	flag.Parse()

	res := result{Quantile: quantile, CeilingMs: float64(ceiling.Milliseconds())}
	for i := range max(*nseeds, 1) {
		res.Seeds = append(res.Seeds, *seed+uint64(i))
	}
	ws := workloads()
	if *set == "stress" {
		ws = stress()
	}
	res.Set = *set
	for _, w := range ws {
		if *only != "" && !strings.Contains(w.Name, *only) {
			continue
		}
		wr := wresult{Name: w.Name, Concurrency: w.Concurrency, HangEvery: w.HangEvery, Hosts: w.Hosts, PerHost: w.PerHost,
			LoadBefore: loadavg()}
		start := time.Now()
		accs := make([]acc, len(w.Regimes))
		for i, s := range res.Seeds {
			one := make([]acc, len(w.Regimes))
			var probe func(int, int)
			if *probeOn && i == 0 {
				var pmu sync.Mutex
				probe = func(id, ms int) {
					pmu.Lock()
					defer pmu.Unlock()
					if id%*probeEvery == 0 {
						wr.Timeouts = append(wr.Timeouts, [2]int{id, ms})
					}
				}
			}
			cuts, strag := runOnce(&w, s, one, probe)
			for j := range accs {
				accs[j].merge(&one[j])
			}
			if i == 0 {
				wr.Cuts, wr.Stragglers = cuts, strag
			}
		}
		wr.WallSeconds = round(time.Since(start).Seconds(), 1)
		wr.LoadAfter = loadavg()
		for i, r := range w.Regimes {
			wr.Rows = append(wr.Rows, makeRow(&w, r.Name, r.Dist.Name, r.Counted, &accs[i]))
		}
		for _, p := range w.Pools {
			var a acc
			for _, i := range p.Regimes {
				a.merge(&accs[i])
			}
			wr.Rows = append(wr.Rows, makeRow(&w, p.Name, "pooled", true, &a))
		}
		printWorkload(os.Stdout, &wr)
		res.Workloads = append(res.Workloads, wr)
	}
	res.Go = runtime.Version()
	if *jsonOut != "" {
		b, err := json.MarshalIndent(res, "", "  ")
		if err == nil {
			err = os.WriteFile(*jsonOut, append(b, '\n'), 0o644)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}

func printWorkload(out io.Writer, wr *wresult) {
	fmt.Fprintf(out, "\n%s (%d callers, 1 attempt in %d hangs, %.0fs, loadavg %s -> %s)\n", wr.Name, wr.Concurrency, wr.HangEvery,
		wr.WallSeconds, wr.LoadBefore, wr.LoadAfter)
	fmt.Fprintf(out, "%-18s %8s %8s %9s %9s %9s %8s %9s %5s %9s %9s %8s %8s %6s %s\n", "regime", "attempts", "p50", "p99.9", "obs99.9", "false(st)", "rate",
		"cutAt", "hung", "holdMed", "holdMax", "/p99.9", "/local", "fail", "goals")
	for _, r := range wr.Rows {
		goals := "-"
		if r.Counted {
			goals = verdict(r.FalseOK, "false") + " hold:n/a"
			if r.HoldJudged {
				goals = verdict(r.FalseOK, "false") + " " + verdict(r.HoldOK, "hold")
			}
		}
		fmt.Fprintf(out, "%-18s %8d %6.1fms %7.1fms %7.1fms %4d(%3d) %7.3f%% %7.1fms %2d/%-2d %7.1fms %7.1fms %7.2fx %7.2fx %6d %s\n",
			r.Regime, r.Attempts, r.TrueMedianMs, r.TrueP999Ms, r.ObservedP999Ms, r.FalseTimeouts, r.FalseShort, 100*r.FalseRate, r.FalseCutAtMedMs,
			r.HungCut, r.Hung, r.HoldMedianMs, r.HoldMaxMs, r.HoldOverP999, r.HoldOverLocalP999, r.Failed, goals)
	}
}

func verdict(ok bool, what string) string {
	if ok {
		return what + ":ok"
	}
	return what + ":FAIL"
}

func round(x float64, decimals int) float64 {
	p := math.Pow(10, float64(decimals))
	return math.Round(x*p) / p
}
