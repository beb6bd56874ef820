package bench

import (
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/failsafe-go/failsafe-go/hedgepolicy"
	"github.com/herdproof/retryhttp"
)

// The hedging matrix: latency distributions served over real loopback
// connections, HTTP/1.1 and h2c, hedged at the 95th percentile measured
// without hedging (what docs/guide-hedging.md tells users to set).

// Latency is how long the hedging server takes to answer one copy.
type Latency struct {
	// Kind is "tail" (SlowShare of the copies take Slow, the rest uniform
	// in [Min, Max]), "lognormal" (median Median, shape Sigma, at most
	// Slow) or "constant" (every copy takes Slow).
	Kind      string        `json:"kind"`
	Min       time.Duration `json:"min,omitempty"`
	Max       time.Duration `json:"max,omitempty"`
	Slow      time.Duration `json:"slow,omitempty"`
	SlowShare float64       `json:"slow_share,omitempty"`
	Median    time.Duration `json:"median,omitempty"`
	Sigma     float64       `json:"sigma,omitempty"`
}

func (l Latency) draw(r *rand.Rand) time.Duration {
	switch l.Kind {
	case "tail":
		if r.Float64() < l.SlowShare {
			return l.Slow
		}
		return l.Min + time.Duration(r.Int64N(int64(l.Max-l.Min)+1))
	case "lognormal":
		d := time.Duration(float64(l.Median) * math.Exp(l.Sigma*r.NormFloat64()))
		return min(d, l.Slow)
	case "constant":
		return l.Slow
	}
	panic("bench: unknown latency kind " + l.Kind)
}

// HedgeWorkload is one cell of the hedging matrix.
type HedgeWorkload struct {
	// Name names the latency; the protocol is added to it in results.
	Name    string  `json:"name"`
	Latency Latency `json:"latency"`
	// Workers send requests concurrently, each one after the other:
	// Requests in all, or for For if it is not zero.
	Workers  int           `json:"workers"`
	Requests int           `json:"requests,omitempty"`
	For      time.Duration `json:"for,omitempty"`
	// DelayFrom, if not empty, names the workload whose 95th percentile
	// without hedging is the hedge delay (the delay a user set for normal
	// times); empty means this workload's own, measured first.
	DelayFrom string `json:"delay_from,omitempty"`
}

// Hedging workload names.
const (
	HedgeTail      = "tail-1%"
	HedgeLognormal = "lognormal"
	HedgeSlowAll   = "slow-all-5s"
)

// HedgeMatrix returns the hedging workloads: 1% of copies taking 1 s and the
// rest 1 to 3 ms; a lognormal latency (median 2 ms, shape 1, capped at 1 s);
// every copy taking 100 ms for 5 s, hedged at the first one's delay.
func HedgeMatrix() []HedgeWorkload {
	ms := time.Millisecond
	return []HedgeWorkload{
		{Name: HedgeTail, Latency: Latency{Kind: "tail", Min: 1 * ms, Max: 3 * ms, Slow: time.Second, SlowShare: 0.01}, Workers: 8, Requests: 4000},
		{Name: HedgeLognormal, Latency: Latency{Kind: "lognormal", Median: 2 * ms, Sigma: 1, Slow: time.Second}, Workers: 8, Requests: 4000},
		{Name: HedgeSlowAll, Latency: Latency{Kind: "constant", Slow: 100 * ms}, Workers: 8, For: 5 * time.Second, DelayFrom: HedgeTail},
	}
}

// SmokeHedgeMatrix is HedgeMatrix cut down for CI.
func SmokeHedgeMatrix() []HedgeWorkload {
	w := HedgeMatrix()
	w[0].Requests, w[1].Requests, w[2].For = 400, 300, time.Second
	return w
}

// HedgePeer is one hedging implementation: New wraps base, hedging after
// delay.
type HedgePeer struct {
	Name string
	New  func(base http.RoundTripper, delay time.Duration) http.RoundTripper
}

// Names of the hedging matrix's peers.
const (
	HedgePeerNone              = "none"
	HedgePeerFailsafe          = "failsafe"
	HedgePeerFailsafeBudget    = "failsafe+budget"
	HedgePeerFailsafeQuantile  = "failsafe-auto-p95"
	HedgePeerRetryHTTP         = "retryhttp"
	HedgePeerRetryHTTPQuantile = "retryhttp-auto-p95"
)

// RetryHTTPHedgePeer is a retryhttp Transport that newTransport configures
// for a base and a hedge delay. Plug a variant in with, for example:
//
//	bench.RetryHTTPHedgePeer("mine", func(base http.RoundTripper, d time.Duration) *retryhttp.Transport {
//		return &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{HedgeDelay: d}, Budget: myBudget()}
//	})
func RetryHTTPHedgePeer(name string, newTransport func(base http.RoundTripper, delay time.Duration) *retryhttp.Transport) HedgePeer {
	return HedgePeer{Name: name, New: func(base http.RoundTripper, d time.Duration) http.RoundTripper {
		return newTransport(base, d)
	}}
}

// DefaultHedgePeers are the hedging matrix's peers: no hedging (retryhttp
// without HedgeDelay, which measures the delay), failsafe-go's hedge policy
// at the delay without and with its own budget (budget.New(): hedges and
// retries at most 20% of executions in flight, at least 3), failsafe-go's
// automatic delay at its running 95th percentile, and retryhttp at the delay
// and at its own running 95th percentile (Policy.HedgeQuantile).
func DefaultHedgePeers() []HedgePeer {
	return []HedgePeer{
		{HedgePeerNone, func(base http.RoundTripper, _ time.Duration) http.RoundTripper {
			return &retryhttp.Transport{Base: base}
		}},
		{HedgePeerFailsafe, func(base http.RoundTripper, d time.Duration) http.RoundTripper {
			return failsafehttp.NewRoundTripper(base, hedgepolicy.NewWithDelay[*http.Response](d))
		}},
		{HedgePeerFailsafeBudget, func(base http.RoundTripper, d time.Duration) http.RoundTripper {
			return failsafehttp.NewRoundTripper(base, hedgepolicy.NewBuilderWithDelay[*http.Response](d).WithBudget(budget.New()).Build())
		}},
		{HedgePeerFailsafeQuantile, func(base http.RoundTripper, _ time.Duration) http.RoundTripper {
			// Remembers about the last 100 executions; hedges after 20.
			return failsafehttp.NewRoundTripper(base, hedgepolicy.NewWithDelayQuantile[*http.Response](0.95, 100, 20))
		}},
		RetryHTTPHedgePeer(HedgePeerRetryHTTP, func(base http.RoundTripper, d time.Duration) *retryhttp.Transport {
			return &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{HedgeDelay: d}}
		}),
		RetryHTTPHedgePeer(HedgePeerRetryHTTPQuantile, func(base http.RoundTripper, _ time.Duration) *retryhttp.Transport {
			return &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{HedgeQuantile: 0.95}}
		}),
	}
}

// HedgeResult is one peer on one workload, protocol and seed.
type HedgeResult struct {
	Workload string `json:"workload"`
	Proto    string `json:"proto"`
	Peer     string `json:"peer"`
	Seed     uint64 `json:"seed"`
	// DelayMs is the hedge delay, the 95th percentile without hedging.
	DelayMs  float64 `json:"delay_ms"`
	Requests int     `json:"requests"`
	P50Ms    float64 `json:"p50_ms"`
	P95Ms    float64 `json:"p95_ms"`
	P99Ms    float64 `json:"p99_ms"`
	P999Ms   float64 `json:"p999_ms"`
	// RequestsPerRequest is the copies the peer sent (counted at its base
	// transport) per request, over the whole run; FirstSecond the same for
	// the requests made in the run's first second. ServerPerRequest is
	// what reached the server's handler per request (a copy canceled on
	// the way may not).
	RequestsPerRequest float64 `json:"requests_per_request"`
	FirstSecond        float64 `json:"first_second"`
	ServerPerRequest   float64 `json:"server_per_request"`
	// Failed counts the requests that got no 200 with its whole body (an
	// error, a status, or a body cut short). Their latencies are in the
	// percentiles all the same: the time until the caller had its answer.
	Failed int `json:"failed"`
}

// Key is the result's workload and protocol, as "tail-1%/h2c".
func (r HedgeResult) Key() string { return r.Workload + "/" + r.Proto }

// hedgeServer is a loopback server whose answers take a drawn latency; it
// counts the copies it receives.
type hedgeServer struct {
	*httptest.Server
	received atomic.Int64
}

func newHedgeServer(lat Latency, seed uint64, h2c bool) *hedgeServer {
	s := &hedgeServer{}
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, 7))
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.received.Add(1)
		mu.Lock()
		d := lat.draw(rng)
		mu.Unlock()
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			io.WriteString(w, "ok")
		case <-r.Context().Done():
		}
	}))
	if h2c {
		s.Config.Protocols = new(http.Protocols)
		s.Config.Protocols.SetHTTP1(true)
		s.Config.Protocols.SetUnencryptedHTTP2(true)
	}
	s.Start()
	return s
}

// hedgeBase is the client's transport for a protocol: HTTP/1.1 with enough
// idle connections for the workers and their hedges, or h2c (HTTP/2 without
// TLS, prior knowledge) over one connection.
func hedgeBase(workers int, h2c bool) *http.Transport {
	t := &http.Transport{MaxIdleConnsPerHost: 4 * workers}
	if h2c {
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return t
}

// countingBase counts the copies sent per request (by the request's index
// header, which every library copies onto its hedges) and in all.
type countingBase struct {
	base   http.RoundTripper
	copies []atomic.Int32
}

func (c *countingBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if i, err := strconv.Atoi(req.Header.Get("X-Request-Index")); err == nil && i >= 0 && i < len(c.copies) {
		c.copies[i].Add(1)
	}
	return c.base.RoundTrip(req)
}

// maxHedgeRequests bounds the requests of a timed run.
const maxHedgeRequests = 1 << 20

// runHedgeOnce runs one peer on one workload in real time.
func runHedgeOnce(w HedgeWorkload, proto string, peer HedgePeer, delay time.Duration, seed uint64) HedgeResult {
	h2c := proto == "h2c"
	srv := newHedgeServer(w.Latency, seed, h2c)
	defer srv.Close()
	base := hedgeBase(w.Workers, h2c)
	defer base.CloseIdleConnections()
	n := w.Requests
	if w.For > 0 {
		n = maxHedgeRequests
	}
	counted := &countingBase{base: base, copies: make([]atomic.Int32, n)}
	rt := peer.New(counted, delay)

	type sample struct {
		latency time.Duration
		early   bool // made in the first second
		failed  bool
	}
	samples := make([]sample, n)
	var next atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range w.Workers {
		wg.Go(func() {
			for {
				if w.For > 0 && time.Since(start) >= w.For {
					return
				}
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
				req.Header.Set("X-Request-Index", strconv.FormatInt(i, 10))
				t0 := time.Now()
				resp, err := rt.RoundTrip(req)
				failed := err != nil
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					failed = err != nil || resp.StatusCode != http.StatusOK
				}
				samples[i] = sample{time.Since(t0), t0.Sub(start) < time.Second, failed}
			}
		})
	}
	wg.Wait()
	made := min(int(next.Load()), n)
	samples = samples[:made]
	srv.Close() // waits for the canceled copies' handlers
	var sent, early, earlySent, failed int
	lat := make([]time.Duration, made)
	for i, s := range samples {
		c := int(counted.copies[i].Load())
		sent += c
		lat[i] = s.latency
		if s.failed {
			failed++
		}
		if s.early {
			early++
			earlySent += c
		}
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		return round3(float64(lat[min(made-1, int(p*float64(made)))]) / float64(time.Millisecond))
	}
	r := HedgeResult{Workload: w.Name, Proto: proto, Peer: peer.Name, Seed: seed, DelayMs: round3(float64(delay) / float64(time.Millisecond)),
		Requests: made, P50Ms: q(0.50), P95Ms: q(0.95), P99Ms: q(0.99), P999Ms: q(0.999),
		RequestsPerRequest: round3(float64(sent) / float64(made)),
		ServerPerRequest:   round3(float64(srv.received.Load()) / float64(made)),
		Failed:             failed}
	if early > 0 {
		r.FirstSecond = round3(float64(earlySent) / float64(early))
	}
	return r
}

// hedgeProtos are the protocols of the hedging matrix.
var hedgeProtos = []string{"http1", "h2c"}

// RunHedgeMatrix runs every peer on every workload, over HTTP/1.1 and h2c,
// for seeds 1 to seeds, in real time over loopback. On each workload whose
// DelayFrom is empty, the peer named HedgePeerNone runs first (it must be
// among peers) and its 95th percentile becomes the hedge delay; a workload
// with a DelayFrom must come after the workload it names, and the peer
// HedgePeerNone does not run on it. The runs of a timed workload (For set)
// run at once, each with a server of its own: they measure load, which a
// busy CPU does not change when every copy takes far longer than the delay;
// the others run one after the other. progress, if not nil, is called after
// each run.
func RunHedgeMatrix(workloads []HedgeWorkload, peers []HedgePeer, seeds int, progress func(HedgeResult)) []HedgeResult {
	var out []HedgeResult
	report := func(r HedgeResult) {
		out = append(out, r)
		if progress != nil {
			progress(r)
		}
	}
	none, haveNone := findHedgePeer(peers, HedgePeerNone)
	var hedgers []HedgePeer
	for _, p := range peers {
		if p.Name != HedgePeerNone {
			hedgers = append(hedgers, p)
		}
	}
	for seed := range seeds {
		s := uint64(seed + 1)
		for _, proto := range hedgeProtos {
			delays := map[string]time.Duration{}
			for _, w := range workloads {
				var delay time.Duration
				if w.DelayFrom == "" {
					if !haveNone {
						panic("bench: the hedging matrix needs the peer " + HedgePeerNone)
					}
					r := runHedgeOnce(w, proto, none, 0, s)
					delay = time.Duration(r.P95Ms * float64(time.Millisecond))
					r.DelayMs = r.P95Ms
					report(r)
				} else {
					d, ok := delays[w.DelayFrom]
					if !ok {
						panic("bench: " + w.Name + " takes its delay from " + w.DelayFrom + ", which has not run")
					}
					delay = d
				}
				delays[w.Name] = delay
				if w.For == 0 {
					for _, p := range hedgers {
						report(runHedgeOnce(w, proto, p, delay, s))
					}
					continue
				}
				results := make([]HedgeResult, len(hedgers))
				var wg sync.WaitGroup
				for i, p := range hedgers {
					wg.Go(func() { results[i] = runHedgeOnce(w, proto, p, delay, s) })
				}
				wg.Wait()
				for _, r := range results {
					report(r)
				}
			}
		}
	}
	return out
}

func findHedgePeer(peers []HedgePeer, name string) (HedgePeer, bool) {
	for _, p := range peers {
		if p.Name == name {
			return p, true
		}
	}
	return HedgePeer{}, false
}

// HedgeSummary is one peer on one workload and protocol, over the seeds.
type HedgeSummary struct {
	Workload           string `json:"workload"`
	Proto              string `json:"proto"`
	Peer               string `json:"peer"`
	DelayMs            Stat   `json:"delay_ms"`
	P50Ms              Stat   `json:"p50_ms"`
	P99Ms              Stat   `json:"p99_ms"`
	P999Ms             Stat   `json:"p999_ms"`
	RequestsPerRequest Stat   `json:"requests_per_request"`
	FirstSecond        Stat   `json:"first_second"`
}

// Key is the summary's workload and protocol, as "tail-1%/h2c".
func (s HedgeSummary) Key() string { return s.Workload + "/" + s.Proto }

// SummariseHedges groups results by workload, protocol and peer, in the
// order they first appear.
func SummariseHedges(results []HedgeResult) []HedgeSummary {
	type key struct{ w, proto, peer string }
	var out []HedgeSummary
	for _, rs := range GroupInOrder(results, func(r HedgeResult) key { return key{r.Workload, r.Proto, r.Peer} }) {
		k := key{rs[0].Workload, rs[0].Proto, rs[0].Peer}
		of := func(f func(HedgeResult) float64) Stat {
			xs := make([]float64, len(rs))
			for i, r := range rs {
				xs[i] = f(r)
			}
			return StatOf(xs)
		}
		out = append(out, HedgeSummary{Workload: k.w, Proto: k.proto, Peer: k.peer,
			DelayMs:            of(func(r HedgeResult) float64 { return r.DelayMs }),
			P50Ms:              of(func(r HedgeResult) float64 { return r.P50Ms }),
			P99Ms:              of(func(r HedgeResult) float64 { return r.P99Ms }),
			P999Ms:             of(func(r HedgeResult) float64 { return r.P999Ms }),
			RequestsPerRequest: of(func(r HedgeResult) float64 { return r.RequestsPerRequest }),
			FirstSecond:        of(func(r HedgeResult) float64 { return r.FirstSecond }),
		})
	}
	return out
}

// HedgeGoals are issue 18's goals for hedging, compared on the medians over
// the seeds.
type HedgeGoals struct {
	// P999Ratio: on HedgeTail, p99.9 at most this times failsafe-go's
	// (HedgePeerFailsafe)...
	P999Ratio float64
	// TailMaxCopies: ...at no more than this many copies per request.
	TailMaxCopies float64
	// SlowMaxCopies: on HedgeSlowAll, no more than this many copies per
	// request over the whole run, from its first second.
	SlowMaxCopies float64
}

// IssueHedgeGoals returns the goals as issue 18 states them: at the p95
// delay, on a tail of 1% slow copies, p99.9 within 1.2x of failsafe-go's at
// no more than 6% extra copies; when everyone is slow, at most 5% extra over
// the whole run.
func IssueHedgeGoals() HedgeGoals {
	return HedgeGoals{P999Ratio: 1.2, TailMaxCopies: 1.06, SlowMaxCopies: 1.05}
}

// Hedging goal names.
const (
	GoalP999   = "p99.9"
	GoalCopies = "copies"
)

// CheckHedgeGoals checks the peer called ours against the goals, per
// protocol, on the workloads HedgeTail and HedgeSlowAll. A test asserts
// them as it asserts CheckThrottleGoals's.
func CheckHedgeGoals(sums []HedgeSummary, ours string, g HedgeGoals) []GoalCheck {
	find := func(key, peer string) (HedgeSummary, bool) {
		for _, s := range sums {
			if s.Key() == key && s.Peer == peer {
				return s, true
			}
		}
		return HedgeSummary{}, false
	}
	var checks []GoalCheck
	for _, proto := range hedgeProtos {
		tail := HedgeTail + "/" + proto
		if me, ok := find(tail, ours); ok {
			if fs, ok := find(tail, HedgePeerFailsafe); ok {
				got, bound := float64(me.P999Ms.Median), g.P999Ratio*float64(fs.P999Ms.Median)
				checks = append(checks, GoalCheck{ours, tail, GoalP999, Num(got), Num(bound), got <= bound,
					fmt.Sprintf("p99.9 %.1f ms; want <= %.1f ms (%gx %s's %.1f ms)", got, bound, g.P999Ratio, HedgePeerFailsafe, float64(fs.P999Ms.Median))})
			}
			got := float64(me.RequestsPerRequest.Median)
			checks = append(checks, GoalCheck{ours, tail, GoalCopies, Num(got), Num(g.TailMaxCopies), got <= g.TailMaxCopies,
				fmt.Sprintf("%.3f copies a request; want <= %.2f", got, g.TailMaxCopies)})
		}
		slow := HedgeSlowAll + "/" + proto
		if me, ok := find(slow, ours); ok {
			got := float64(me.RequestsPerRequest.Median)
			checks = append(checks, GoalCheck{ours, slow, GoalCopies, Num(got), Num(g.SlowMaxCopies), got <= g.SlowMaxCopies,
				fmt.Sprintf("%.3f copies a request over the run (%.3f in its first second); want <= %.2f", got, float64(me.FirstSecond.Median), g.SlowMaxCopies)})
		}
	}
	return checks
}

// HedgeMatrixTable renders summaries as Markdown.
func HedgeMatrixTable(sums []HedgeSummary) string {
	var b strings.Builder
	b.WriteString("| workload | peer | hedge delay (ms) | p50 (ms) | p99 (ms) | p99.9 (ms) | copies per request | in the first second |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, s := range sums {
		delay := fmtStat(s.DelayMs, "%.2f")
		if s.Peer == HedgePeerNone {
			delay = "(p95: " + delay + ")"
		} else if s.Peer == HedgePeerFailsafeQuantile {
			delay = "auto p95"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", s.Key(), s.Peer, delay,
			fmtStat(s.P50Ms, "%.1f"), fmtStat(s.P99Ms, "%.1f"), fmtStat(s.P999Ms, "%.1f"),
			fmtStat(s.RequestsPerRequest, "%.3f"), fmtStat(s.FirstSecond, "%.3f"))
	}
	return b.String()
}

// HedgeReport is a saved run of the hedging matrix (what cmd/hedgematrix
// -json writes, and -in reads).
type HedgeReport struct {
	Date      string          `json:"date"`
	Go        string          `json:"go"`
	Modules   []string        `json:"modules"`
	Seeds     int             `json:"seeds"`
	Workloads []HedgeWorkload `json:"workloads"`
	Checked   []string        `json:"checked"`
	Goals     HedgeGoals      `json:"goals"`
	Results   []HedgeResult   `json:"results"`
	Summaries []HedgeSummary  `json:"summaries"`
	Checks    []GoalCheck     `json:"checks"`
}

// NewHedgeReport summarises results and checks the goals of each peer in
// checked.
func NewHedgeReport(workloads []HedgeWorkload, results []HedgeResult, seeds int, checked []string, g HedgeGoals) HedgeReport {
	r := HedgeReport{Date: time.Now().UTC().Format("2006-01-02"), Go: runtime.Version(), Modules: PeerModules(),
		Seeds: seeds, Workloads: workloads, Checked: checked, Goals: g, Results: results, Summaries: SummariseHedges(results)}
	for _, p := range checked {
		r.Checks = append(r.Checks, CheckHedgeGoals(r.Summaries, p, g)...)
	}
	return r
}

// Print writes the report's tables as Markdown.
func (r HedgeReport) Print(w io.Writer) {
	fmt.Fprintf(w, "Hedging matrix, %s, %s, %d seed(s), loopback, %d workers each; %s\n\n", r.Date, r.Go, r.Seeds, workerCount(r.Workloads), strings.Join(r.Modules, ", "))
	fmt.Fprintf(w, "Medians over the seeds, [min-max] when they differ. Hedge delay: the p95 measured without hedging (%s's from %s).\n\n", HedgeSlowAll, HedgeTail)
	fmt.Fprint(w, HedgeMatrixTable(r.Summaries))
	for _, p := range r.Checked {
		fmt.Fprintf(w, "\nGoals of issue 18 for %s:\n\n", p)
		for _, c := range r.Checks {
			if c.Peer == p {
				verdict := "yes"
				if !c.OK {
					verdict = "**no**"
				}
				fmt.Fprintf(w, "- %s, %s: %s: %s\n", c.Workload, c.Goal, verdict, c.Detail)
			}
		}
	}
}

func workerCount(ws []HedgeWorkload) int {
	if len(ws) == 0 {
		return 0
	}
	return ws[0].Workers
}
