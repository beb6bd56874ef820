package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The throttling matrix: many workloads, each run for several seeds, each
// seed run once per peer in a synctest bubble of its own, against a server
// called in memory. In fake time a run of 30 to 40 s takes a tenth of a
// second of CPU for retryhttp and several seconds for the AWS SDK, whose
// waiters all wake whenever a send token is due. No single workload decides
// a comparison: a claim holds only where it holds across the matrix.

// Step is a change of the server's capacity: Rate requests per second from
// At on.
type Step struct {
	At   time.Duration `json:"at"`
	Rate float64       `json:"rate"`
}

// Workload is one cell of the throttling matrix.
type Workload struct {
	// Name says what the workload is: the capacity's schedule, the clients
	// (count, "c" for equal rates, "u" for rates spread over 10x), the
	// offered load over the first capacity, the service time, the
	// deadline, and "ra" when the 429s carry Retry-After.
	Name string `json:"name"`
	// Capacity is what the server admits: a token bucket filled at
	// Capacity[0].Rate from the start, and at each later Step's Rate from
	// its At on. It holds BurstSeconds of the current rate (at least one
	// request) and answers 429 when empty.
	Capacity []Step `json:"capacity"`
	// Service is how long the server takes to answer, a 200 or a 429.
	Service time.Duration `json:"service"`
	// Deadline is each request's deadline, from when its caller makes it.
	Deadline time.Duration `json:"deadline"`
	// Rates are the clients' offered rates in requests per second, one
	// client each, with Poisson arrivals.
	Rates []float64 `json:"rates"`
	// RetryAfter, if not zero, is sent with every 429: Retry-After in
	// whole seconds (rounded up, RFC 9110) and x-amz-retry-after in
	// milliseconds (what the AWS SDKs read).
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Quota, if not zero, replaces the token bucket with a quota counted
	// in fixed windows of this length from the start, as many APIs count
	// theirs: the server admits the window's share of the capacity
	// (Capacity's rate at the window's start times Quota) and answers 429
	// after that, with Retry-After: the time left until the window resets
	// (x-amz-retry-after in milliseconds, Retry-After in whole seconds
	// rounded up). A client that honours it sends nothing that would be
	// refused; one that does not keeps sending into a closed window.
	Quota time.Duration `json:"quota,omitempty"`
	// Demand, if not empty, scales the clients' rates over time: by
	// Demand[0].Rate from the start, and by each later Step's Rate from its
	// At on (a swing of the demand, where Capacity swings the server).
	// A factor of 0 is a pause of the demand: no calls until the next Step.
	Demand []Step `json:"demand,omitempty"`
	// Starts, if not empty, is when each client makes its first call:
	// client i from Starts[i] on (clients past its end from the start).
	Starts []time.Duration `json:"starts,omitempty"`
	// Duration is how long the clients make requests.
	Duration time.Duration `json:"duration"`
}

// scaleAt is the factor of the clients' rates at d since the start.
func (w Workload) scaleAt(d time.Duration) float64 {
	f := 1.0
	for _, s := range w.Demand {
		if s.At <= d {
			f = s.Rate
		}
	}
	return f
}

// BurstSeconds is how much of its current rate the matrix server's token
// bucket holds.
const BurstSeconds = 0.1

// MatrixSeeds is the seeds per workload of the saved run of the matrix
// (lab/runs/throttling-matrix.json): enough that the goals met, which compare
// medians, move little with the AWS SDK's draw.
const MatrixSeeds = 15

// startOf is when client c makes calls from.
func (w Workload) startOf(c int) time.Duration {
	if c < len(w.Starts) {
		return w.Starts[c]
	}
	return 0
}

// nextDemand is the At of the first Demand step after d (Duration if none).
func (w Workload) nextDemand(d time.Duration) time.Duration {
	for _, s := range w.Demand {
		if s.At > d {
			return s.At
		}
	}
	return w.Duration
}

// offeredAt is the offered load at d since the start: the rates of the
// clients started by then, times the demand's factor.
func (w Workload) offeredAt(d time.Duration) float64 {
	if len(w.Starts) == 0 {
		return w.Offered() * w.scaleAt(d)
	}
	var sum float64
	for c, r := range w.Rates {
		if w.startOf(c) <= d {
			sum += r
		}
	}
	return sum * w.scaleAt(d)
}

// Offered is the clients' offered load in requests per second.
func (w Workload) Offered() float64 {
	var sum float64
	for _, r := range w.Rates {
		sum += r
	}
	return sum
}

// capacityAt is the server's rate at d since the start and when it next
// changes (math.MaxInt64 after the last step).
func (w Workload) capacityAt(d time.Duration) (rate float64, until time.Duration) {
	until = time.Duration(math.MaxInt64)
	for i, s := range w.Capacity {
		if s.At > d {
			return w.Capacity[max(i-1, 0)].Rate, s.At
		}
		rate = s.Rate
	}
	return rate, until
}

// attainable is what a perfect client population gets between from and to:
// the integral of min(capacity, offered load), in requests.
func (w Workload) attainable(from, to time.Duration) float64 {
	var sum float64
	for t := from; t < to; {
		rate, next := w.capacityAt(t)
		end := min(next, to)
		if len(w.Demand) > 0 || len(w.Starts) > 0 { // in bins, where the demand may change
			end = min(end, t+matrixBin)
		}
		sum += min(rate, w.offeredAt(t)) * (end - t).Seconds()
		t = end
	}
	return sum
}

// rises are the steps at which the capacity goes up.
func (w Workload) rises() []int {
	var r []int
	for i := 1; i < len(w.Capacity); i++ {
		if w.Capacity[i].Rate > w.Capacity[i-1].Rate {
			r = append(r, i)
		}
	}
	return r
}

// EqualRates is n clients sharing total requests per second equally.
func EqualRates(n int, total float64) []float64 {
	r := make([]float64, n)
	for i := range r {
		r[i] = total / float64(n)
	}
	return r
}

// SpreadRates is n clients whose rates grow geometrically from the
// smallest to ratio times it, adding up to total.
func SpreadRates(n int, total, ratio float64) []float64 {
	if n == 1 {
		return []float64{total}
	}
	r := make([]float64, n)
	var sum float64
	for i := range r {
		r[i] = math.Pow(ratio, float64(i)/float64(n-1))
		sum += r[i]
	}
	for i := range r {
		r[i] *= total / sum
	}
	return r
}

// Capacity schedules of the matrix, for a capacity c and a run of d.
func steady(c float64) []Step { return []Step{{0, c}} }

// halves: c, then c/2 from half time.
func halves(c float64, d time.Duration) []Step { return []Step{{0, c}, {d / 2, c / 2}} }

// drop10x: c for a quarter of the run, c/10 for a quarter, c again for the
// second half.
func drop10x(c float64, d time.Duration) []Step {
	return []Step{{0, c}, {d / 4, c / 10}, {d / 2, c}}
}

// stepped: five equal phases at c, c/2, c/4, 3c/4 and c.
func stepped(c float64, d time.Duration) []Step {
	p := d / 5
	return []Step{{0, c}, {p, c / 2}, {2 * p, c / 4}, {3 * p, 3 * c / 4}, {4 * p, c}}
}

// matrixCapacity is the first capacity of every matrix workload.
const matrixCapacity = 100

// workload builds a named matrix workload: schedule is "steady", "halves",
// "drop10x" or "steps"; clients is the count; unequal spreads the rates
// over 10x; load is the offered load over the first capacity.
func workload(schedule string, clients int, unequal bool, load float64, service, deadline time.Duration, retryAfter bool) Workload {
	const c = matrixCapacity
	d := 30 * time.Second
	var caps []Step
	switch schedule {
	case "steady":
		caps = steady(c)
	case "halves":
		caps = halves(c, d)
	case "drop10x":
		d = 40 * time.Second
		caps = drop10x(c, d)
	case "steps":
		d = 40 * time.Second
		caps = stepped(c, d)
	default:
		panic("bench: unknown schedule " + schedule)
	}
	kind, rates := "c", EqualRates(clients, load*c)
	if unequal {
		kind, rates = "u", SpreadRates(clients, load*c, 10)
	}
	w := Workload{Capacity: caps, Service: service, Deadline: deadline, Rates: rates, Duration: d}
	w.Name = fmt.Sprintf("%s/%d%s/%gx/%dms/%v", schedule, clients, kind, load, service.Milliseconds(), deadline)
	if retryAfter {
		w.RetryAfter = time.Second
		w.Name += "/ra"
	}
	return w
}

// withQuota turns a steady workload's token bucket into a quota counted in
// windows of q (see Workload.Quota), whose 429s say when the window resets.
func withQuota(w Workload, q time.Duration) Workload {
	w.Quota = q
	w.Name = fmt.Sprintf("quota%v", q) + strings.TrimPrefix(w.Name, "steady")
	return w
}

// ThrottleMatrix returns the workloads of the full matrix. Each varies a
// few of: the capacity's schedule (steady; halving; falling 10x and coming
// back; stepping down and up; a quota counted in windows of 3 or 5 s), one
// to 100 clients at equal rates or rates spread over 10x, an offered load
// of 1.25x to 5x the capacity, a service time of 0, 5 or 50 ms, a deadline
// of 0.5 to 5 s, and 429s with or without Retry-After (a fixed 1 s, or the
// time until the quota's window resets). The capacity starts at 100
// requests per second.
func ThrottleMatrix() []Workload {
	ms := time.Millisecond
	s := time.Second
	return []Workload{
		// One client.
		workload("steady", 1, false, 1.25, 5*ms, 1*s, false),
		workload("steady", 1, false, 1.25, 0, 2*s, false),
		workload("steady", 1, false, 2, 50*ms, 5*s, false),
		workload("drop10x", 1, false, 1.25, 5*ms, 1*s, false),
		workload("steady", 1, false, 1.25, 0, 1*s, true),
		withQuota(workload("steady", 1, false, 1.25, 5*ms, 5*s, false), 3*s),
		// Ten to twenty clients.
		workload("steady", 10, false, 2, 0, 1*s, false),
		workload("steady", 10, false, 5, 5*ms, 2*s, false),
		workload("steady", 10, true, 5, 5*ms, 2*s, false),
		workload("steady", 10, true, 2, 0, 500*ms, false),
		workload("steady", 10, false, 5, 50*ms, 500*ms, false),
		workload("halves", 20, false, 5, 0, 1*s, false), // docs/throttling.md's shape, at half its capacity and length
		workload("halves", 10, false, 5, 5*ms, 1*s, false),
		workload("drop10x", 10, false, 2, 5*ms, 2*s, false),
		workload("drop10x", 10, true, 1.25, 50*ms, 5*s, false),
		workload("steps", 10, false, 2, 5*ms, 1*s, false),
		workload("steady", 10, false, 5, 5*ms, 2*s, true),
		workload("drop10x", 10, true, 2, 5*ms, 2*s, true),
		withQuota(workload("steady", 10, true, 2, 5*ms, 2*s, false), 5*s),
		// Fifty to a hundred clients.
		workload("steady", 50, true, 5, 5*ms, 2*s, false),
		workload("steady", 100, false, 1.25, 5*ms, 1*s, false),
		workload("steady", 100, true, 5, 5*ms, 2*s, false),
		workload("steady", 100, true, 2, 50*ms, 5*s, false),
		workload("drop10x", 50, true, 5, 5*ms, 2*s, false),
		workload("drop10x", 100, false, 1.25, 0, 5*s, false),
		workload("steps", 20, true, 5, 50*ms, 2*s, false),
		workload("steady", 100, true, 5, 5*ms, 5*s, true),
	}
}

// SmokeMatrix is a few short workloads of the matrix's kinds, for CI.
func SmokeMatrix() []Workload {
	ms := time.Millisecond
	one := workload("steady", 1, false, 1.25, 5*ms, time.Second, false)
	many := workload("steady", 10, true, 5, 5*ms, time.Second, true)
	drop := workload("drop10x", 10, false, 2, 5*ms, time.Second, false)
	for _, w := range []*Workload{&one, &many, &drop} {
		scale := float64(8*time.Second) / float64(w.Duration)
		for i := range w.Capacity {
			w.Capacity[i].At = time.Duration(float64(w.Capacity[i].At) * scale)
		}
		w.Duration = 8 * time.Second
		w.Name += "/8s"
	}
	return []Workload{one, many, drop}
}

// The server's answers: what the STS API returns for GetCallerIdentity and
// for a throttled call (awsquery protocol), so that a real AWS SDK client
// can read them; the other peers only read the status.
const (
	stsOK = `<GetCallerIdentityResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">` +
		`<GetCallerIdentityResult><Arn>arn:aws:iam::123456789012:user/bench</Arn><UserId>AIDABENCH</UserId>` +
		`<Account>123456789012</Account></GetCallerIdentityResult>` +
		`<ResponseMetadata><RequestId>bench</RequestId></ResponseMetadata></GetCallerIdentityResponse>`
	stsThrottled = `<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/"><Error><Type>Sender</Type>` +
		`<Code>Throttling</Code><Message>Rate exceeded</Message></Error><RequestId>bench</RequestId></ErrorResponse>`
)

// matrixBin is the resolution of what the server and the callers record.
const matrixBin = 100 * time.Millisecond

// matrixServer is the server of one run, called in memory by the callers'
// goroutines (it is their base RoundTripper): it admits from a token bucket
// that follows the workload's capacity, answers after the service time, and
// counts what it saw per bin.
type matrixServer struct {
	w     Workload
	start time.Time

	mu                      sync.Mutex
	tokens                  float64
	last                    time.Duration // of the last refill, since start
	window, used            int           // with a Quota: the current window and what it admitted
	attempts, throttled, ok []int
}

func newMatrixServer(w Workload, start time.Time) *matrixServer {
	bins := int((w.Duration+w.Deadline)/matrixBin) + 2
	rate, _ := w.capacityAt(0)
	return &matrixServer{w: w, start: start, tokens: burst(rate),
		attempts: make([]int, bins), throttled: make([]int, bins), ok: make([]int, bins)}
}

func burst(rate float64) float64 { return max(1, rate*BurstSeconds) }

// admit refills the bucket up to now (since start), one capacity segment at
// a time, and takes a token if there is one; with a Quota, it counts the
// request in its window instead, and reports how long until the window
// resets. Must hold mu.
func (s *matrixServer) admit(now time.Duration) (bool, time.Duration) {
	if q := s.w.Quota; q > 0 {
		w := int(now / q)
		if w != s.window {
			s.window, s.used = w, 0
		}
		rate, _ := s.w.capacityAt(time.Duration(w) * q)
		if s.used < int(rate*q.Seconds()) {
			s.used++
			return true, 0
		}
		return false, time.Duration(w+1)*q - now
	}
	for s.last < now {
		rate, next := s.w.capacityAt(s.last)
		end := min(now, next)
		s.tokens = min(burst(rate), s.tokens+rate*(end-s.last).Seconds())
		s.last = end
	}
	if s.tokens >= 1 {
		s.tokens--
		return true, 0
	}
	return false, s.w.RetryAfter
}

func (s *matrixServer) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	now := time.Since(s.start)
	if rec, ok := ctx.Value(callKey{}).(*callRecord); ok {
		rec.sent(now)
	}
	s.mu.Lock()
	admitted, ra := s.admit(now)
	b := min(int(now/matrixBin), len(s.attempts)-1)
	s.attempts[b]++
	if admitted {
		s.ok[b]++
	} else {
		s.throttled[b]++
	}
	s.mu.Unlock()
	if s.w.Service > 0 {
		// The server has done (or refused) the work; a caller that stops
		// waiting does not undo it.
		t := time.NewTimer(s.w.Service)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
	h := http.Header{"Content-Type": {"text/xml"}}
	status, body := http.StatusOK, stsOK
	if !admitted {
		status, body = http.StatusTooManyRequests, stsThrottled
		if ra > 0 {
			h.Set("Retry-After", strconv.FormatInt(int64((ra+time.Second-1)/time.Second), 10))
			h.Set("X-Amz-Retry-After", strconv.FormatInt(ra.Milliseconds(), 10))
		}
	}
	return &http.Response{StatusCode: status, Status: strconv.Itoa(status) + " " + http.StatusText(status),
		Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, Header: h, ContentLength: int64(len(body)),
		Body: io.NopCloser(strings.NewReader(body)), Request: req}, nil
}

// callKey carries a call's record in its context, down to the server,
// through any library that derives its attempts' contexts from the
// caller's.
type callKey struct{}

// callRecord is when a call's first attempt reached the server, in
// nanoseconds since the start plus one (zero: none yet).
type callRecord struct{ first atomic.Int64 }

func (r *callRecord) sent(now time.Duration) { r.first.CompareAndSwap(0, int64(now)+1) }

// callEntry is one call, as its caller saw it; times since the start.
type callEntry struct {
	client int
	start  time.Duration
	first  time.Duration // of the first attempt; -1 if none was sent
	end    time.Duration
	ok     bool // a 2xx, before the deadline
}

// runLog is what one run recorded: the input of the measures.
type runLog struct {
	w                       Workload
	calls                   []callEntry
	attempts, throttled, ok []int // the server's, per matrixBin
}

// ThrottleResult is one peer's run of one workload with one seed.
type ThrottleResult struct {
	Peer string `json:"peer"`
	Seed uint64 `json:"seed"`
	// Calls is the requests the callers made; CallerOK those that got a
	// 2xx before their deadline (whenever they ended); ServerOK the 2xx the
	// server sent, seen by a caller in time or not; Attempts and Throttled
	// what the server received and answered with 429; NotSent the calls
	// none of whose attempts reached the server.
	Calls     int `json:"calls"`
	CallerOK  int `json:"caller_ok"`
	ServerOK  int `json:"server_ok"`
	Attempts  int `json:"attempts"`
	Throttled int `json:"throttled"`
	NotSent   int `json:"not_sent"`
	// Goodput is the callers' successes that ended within the run's
	// Duration over what the server could give them in that time: the
	// integral of min(capacity, offered load). Under overload throughout,
	// it is the share of the capacity that callers received.
	Goodput float64 `json:"goodput"`
	// PhaseGoodput is the same for each step of the capacity.
	PhaseGoodput []float64 `json:"phase_goodput"`
	// RecoverySeconds is, for the workloads whose capacity goes back up,
	// how long after each rise the callers' successes over the trailing
	// second first reached 90% of min(offered load, the new capacity): the
	// end of that second minus the rise, the longest over the rises. An
	// instant recovery reads 0.9 s at most (the trailing second must fill);
	// Inf ("inf" in JSON) when it did not happen before the next step or
	// the end, and NaN (null) when the capacity never rises.
	RecoverySeconds Num `json:"recovery_s"`
	// Jain is Jain's fairness index of the clients' success shares
	// (CallerOK over Calls, per client, so that a client offering twice
	// as much is expected to get twice as much): (sum x)^2 / (n sum x^2),
	// 1 when every client got the same share, 1/n when one got everything.
	Jain float64 `json:"jain"`
	// WaitP50Ms is the median, over the calls that sent an attempt, of the
	// time from the call to its first attempt reaching the server, in ms.
	WaitP50Ms float64 `json:"wait_p50_ms"`
	// Series is the run second by second (kept for the first seed only).
	Series *Series `json:"series,omitempty"`
}

// Series is a run second by second: the server's attempts, 429s and 2xx,
// and the successes callers saw (by when they saw them).
type Series struct {
	Attempts  []int `json:"attempts"`
	Throttled []int `json:"throttled"`
	ServerOK  []int `json:"server_ok"`
	CallerOK  []int `json:"caller_ok"`
}

// Num is a float64 whose JSON is a number, "inf" for +Inf (a recovery that
// never happened) or null for NaN (a measure that does not apply).
type Num float64

func (n Num) MarshalJSON() ([]byte, error) {
	switch f := float64(n); {
	case math.IsNaN(f):
		return []byte("null"), nil
	case math.IsInf(f, 1):
		return []byte(`"inf"`), nil
	case math.IsInf(f, -1):
		return []byte(`"-inf"`), nil
	default:
		return strconv.AppendFloat(nil, f, 'f', -1, 64), nil
	}
}

func (n *Num) UnmarshalJSON(b []byte) error {
	switch string(b) {
	case "null":
		*n = Num(math.NaN())
	case `"inf"`:
		*n = Num(math.Inf(1))
	case `"-inf"`:
		*n = Num(math.Inf(-1))
	default:
		f, err := strconv.ParseFloat(string(b), 64)
		if err != nil {
			return fmt.Errorf("bench: number %s: %w", b, err)
		}
		*n = Num(f)
	}
	return nil
}

// measure computes a run's measures from its log.
func measure(log runLog) ThrottleResult {
	w := log.w
	r := ThrottleResult{Calls: len(log.calls), RecoverySeconds: Num(math.NaN())}
	for b := range log.attempts {
		r.Attempts += log.attempts[b]
		r.Throttled += log.throttled[b]
		r.ServerOK += log.ok[b]
	}
	bins := len(log.attempts)
	okBins := make([]int, bins) // callers' successes by when they ended
	calls := make([]int, len(w.Rates))
	oks := make([]int, len(w.Rates))
	var waits []time.Duration
	for _, c := range log.calls {
		calls[c.client]++
		if c.first < 0 {
			r.NotSent++
		} else {
			waits = append(waits, c.first-c.start)
		}
		if c.ok {
			r.CallerOK++
			oks[c.client]++
			okBins[min(int(c.end/matrixBin), bins-1)]++
		}
	}
	if len(waits) > 0 {
		slices.Sort(waits)
		r.WaitP50Ms = round3(medianDuration(waits).Seconds() * 1000)
	}
	r.Jain = jainShares(oks, calls)

	within := func(from, to time.Duration) (n int) { // successes that ended in [from, to)
		for b := int(from / matrixBin); b < int(to/matrixBin) && b < bins; b++ {
			n += okBins[b]
		}
		return n
	}
	if a := w.attainable(0, w.Duration); a > 0 {
		r.Goodput = round3(float64(within(0, w.Duration)) / a)
	}
	for i, s := range w.Capacity {
		end := w.Duration
		if i+1 < len(w.Capacity) {
			end = w.Capacity[i+1].At
		}
		var g float64
		if a := w.attainable(s.At, end); a > 0 {
			g = round3(float64(within(s.At, end)) / a)
		}
		r.PhaseGoodput = append(r.PhaseGoodput, g)
	}

	window := int(time.Second / matrixBin)
	for n, i := range w.rises() {
		rise := w.Capacity[i].At
		end := w.Duration
		if i+1 < len(w.Capacity) {
			end = w.Capacity[i+1].At
		}
		target := 0.9 * min(w.offeredAt(rise), w.Capacity[i].Rate)
		rec := math.Inf(1)
		for b := int(rise / matrixBin); b < int(end/matrixBin); b++ {
			sum := 0
			for k := max(b-window+1, 0); k <= b; k++ {
				sum += okBins[k]
			}
			if float64(sum) >= target {
				rec = round3((time.Duration(b+1)*matrixBin - rise).Seconds())
				break
			}
		}
		if n == 0 || rec > float64(r.RecoverySeconds) {
			r.RecoverySeconds = Num(rec)
		}
	}
	return r
}

// series sums a log's bins into seconds, over the run's Duration.
func series(log runLog) *Series {
	per := int(time.Second / matrixBin)
	secs := int((log.w.Duration + time.Second - 1) / time.Second)
	s := &Series{Attempts: make([]int, secs), Throttled: make([]int, secs), ServerOK: make([]int, secs), CallerOK: make([]int, secs)}
	for b := range min(secs*per, len(log.attempts)) {
		s.Attempts[b/per] += log.attempts[b]
		s.Throttled[b/per] += log.throttled[b]
		s.ServerOK[b/per] += log.ok[b]
	}
	for _, c := range log.calls {
		if i := int(c.end / time.Second); c.ok && i < secs {
			s.CallerOK[i]++
		}
	}
	return s
}

// jainShares is Jain's fairness index of oks[i]/calls[i] over the clients
// that made calls; 0 when none got anything.
func jainShares(oks, calls []int) float64 {
	var sum, sq float64
	n := 0
	for i := range oks {
		if calls[i] == 0 {
			continue
		}
		x := float64(oks[i]) / float64(calls[i])
		sum += x
		sq += x * x
		n++
	}
	if sq == 0 {
		return 0
	}
	return round3(sum * sum / (float64(n) * sq))
}

func medianDuration(sorted []time.Duration) time.Duration {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// runMatrixOnce runs one peer on one workload with one seed. It must run in
// a synctest bubble: it sleeps through the whole run in fake time.
func runMatrixOnce(w Workload, peer ThrottlePeer, seed uint64) runLog {
	start := time.Now()
	srv := newMatrixServer(w, start)
	var (
		mu    sync.Mutex
		calls []callEntry
		wg    sync.WaitGroup
	)
	for c, rate := range w.Rates {
		call := peer.NewClient(ClientEnv{Base: srv, URL: "http://sts.bench.test", Rand: lockedRand(seed, uint64(1000+c))})
		arrivals := rand.New(rand.NewPCG(seed, uint64(c)))
		wg.Go(func() {
			var reqs sync.WaitGroup
			at := start.Add(w.startOf(c))
			for {
				if w.scaleAt(at.Sub(start)) == 0 { // the demand paused: on at its next step
					at = start.Add(w.nextDemand(at.Sub(start)))
					if at.Sub(start) >= w.Duration {
						break
					}
					continue
				}
				at = at.Add(time.Duration(arrivals.ExpFloat64() / (rate * w.scaleAt(at.Sub(start))) * float64(time.Second)))
				if at.Sub(start) >= w.Duration {
					break
				}
				if w.scaleAt(at.Sub(start)) == 0 {
					continue // drawn before a pause, due within it: no call
				}
				time.Sleep(time.Until(at))
				reqs.Go(func() {
					rec := &callRecord{}
					begin := time.Now()
					ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), callKey{}, rec), w.Deadline)
					ok := call(ctx)
					end := time.Now()
					ok = ok && end.Before(begin.Add(w.Deadline))
					cancel()
					e := callEntry{client: c, start: begin.Sub(start), first: time.Duration(rec.first.Load()) - 1, end: end.Sub(start), ok: ok}
					mu.Lock()
					calls = append(calls, e)
					mu.Unlock()
				})
			}
			reqs.Wait()
		})
	}
	wg.Wait()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return runLog{w: w, calls: calls, attempts: srv.attempts, throttled: srv.throttled, ok: srv.ok}
}

// lockedRand is a seeded source of uniform integers in [0, n), safe for
// concurrent use: a Policy.Rand.
func lockedRand(seed, stream uint64) func(int64) int64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(seed, stream))
	return func(n int64) int64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Int64N(n)
	}
}

// Stat is a measure over a workload's seeds: the median and the range.
type Stat struct {
	Median Num `json:"median"`
	Min    Num `json:"min"`
	Max    Num `json:"max"`
}

// GroupInOrder groups xs by key, the groups in the order their keys first
// appear and each in the order of xs.
func GroupInOrder[T any, K comparable](xs []T, key func(T) K) [][]T {
	index := map[K]int{}
	var groups [][]T
	for _, x := range xs {
		k := key(x)
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], x)
	}
	return groups
}

// StatOf summarises xs; Inf counts as larger than any number, NaN values are
// left out (and make NaN when all are).
func StatOf(xs []float64) Stat {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		nan := Num(math.NaN())
		return Stat{nan, nan, nan}
	}
	slices.Sort(v)
	n := len(v)
	med := v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	return Stat{Num(med), Num(v[0]), Num(v[n-1])}
}

// PeerSummary is one peer on one workload, over the seeds.
type PeerSummary struct {
	Peer         string `json:"peer"`
	Goodput      Stat   `json:"goodput"`
	PhaseGoodput []Stat `json:"phase_goodput"`
	Throttled    Stat   `json:"throttled"`
	Recovery     Stat   `json:"recovery_s"`
	Jain         Stat   `json:"jain"`
	WaitP50Ms    Stat   `json:"wait_p50_ms"`
	ServerOK     Stat   `json:"server_ok"`
	CallerOK     Stat   `json:"caller_ok"`
	Attempts     Stat   `json:"attempts"`
	NotSent      Stat   `json:"not_sent"`
}

// WorkloadResult is every run of one workload and their summary per peer.
type WorkloadResult struct {
	Workload Workload         `json:"workload"`
	Runs     []ThrottleResult `json:"runs"`
	Peers    []PeerSummary    `json:"peers"`
}

// Peer returns the summary of the peer called name, and whether there is one.
func (r WorkloadResult) Peer(name string) (PeerSummary, bool) {
	for _, p := range r.Peers {
		if p.Peer == name {
			return p, true
		}
	}
	return PeerSummary{}, false
}

// summarise summarises runs per peer, in the order the peers first appear.
func summarise(w Workload, runs []ThrottleResult) WorkloadResult {
	res := WorkloadResult{Workload: w, Runs: runs}
	var peers []string
	for _, r := range runs {
		if !slices.Contains(peers, r.Peer) {
			peers = append(peers, r.Peer)
		}
	}
	// The default peers first, in their order; then the others as they came.
	rank := func(p string) int {
		if i := slices.Index([]string{PeerNone, PeerAWS, PeerFailsafe, PeerRetryHTTP}, p); i >= 0 {
			return i
		}
		return 4 + slices.Index(peers, p)
	}
	slices.SortStableFunc(peers, func(a, b string) int { return rank(a) - rank(b) })
	for _, peer := range peers {
		var mine []ThrottleResult
		for _, r := range runs {
			if r.Peer == peer {
				mine = append(mine, r)
			}
		}
		of := func(f func(ThrottleResult) float64) Stat {
			xs := make([]float64, len(mine))
			for i, r := range mine {
				xs[i] = f(r)
			}
			return StatOf(xs)
		}
		s := PeerSummary{Peer: peer,
			Goodput:   of(func(r ThrottleResult) float64 { return r.Goodput }),
			Throttled: of(func(r ThrottleResult) float64 { return float64(r.Throttled) }),
			Recovery:  of(func(r ThrottleResult) float64 { return float64(r.RecoverySeconds) }),
			Jain:      of(func(r ThrottleResult) float64 { return r.Jain }),
			WaitP50Ms: of(func(r ThrottleResult) float64 { return r.WaitP50Ms }),
			ServerOK:  of(func(r ThrottleResult) float64 { return float64(r.ServerOK) }),
			CallerOK:  of(func(r ThrottleResult) float64 { return float64(r.CallerOK) }),
			Attempts:  of(func(r ThrottleResult) float64 { return float64(r.Attempts) }),
			NotSent:   of(func(r ThrottleResult) float64 { return float64(r.NotSent) }),
		}
		for i := range w.Capacity {
			s.PhaseGoodput = append(s.PhaseGoodput, of(func(r ThrottleResult) float64 { return r.PhaseGoodput[i] }))
		}
		res.Peers = append(res.Peers, s)
	}
	return res
}

// RunThrottleMatrix runs every peer on every workload with seeds 1 to
// seeds, each run in a synctest bubble of its own, as subtests of t, one
// after the other (bubbles in one process do not run faster in parallel),
// and returns the results in the order of workloads. progress, if not nil,
// is called as each workload completes.
func RunThrottleMatrix(t *testing.T, workloads []Workload, peers []ThrottlePeer, seeds int, progress func(WorkloadResult)) []WorkloadResult {
	t.Helper()
	return RunThrottleMatrixShard(t, workloads, peers, seeds, 0, 1, progress)
}

// RunThrottleMatrixShard is RunThrottleMatrix for shard (from 0) of shards:
// it runs only the workload-seed pairs whose index (workload index times
// seeds plus seed index) is shard modulo shards, every peer on each, and
// returns the workloads it ran anything of. CombineResults puts the shards
// together. Shards in processes of their own run in parallel.
func RunThrottleMatrixShard(t *testing.T, workloads []Workload, peers []ThrottlePeer, seeds, shard, shards int, progress func(WorkloadResult)) []WorkloadResult {
	t.Helper()
	var out []WorkloadResult
	t.Run("matrix", func(t *testing.T) {
		for wi, w := range workloads {
			var runs []ThrottleResult
			for seed := range seeds {
				if (wi*seeds+seed)%shards != shard {
					continue
				}
				for _, p := range peers {
					t.Run(fmt.Sprintf("%s/seed%d/%s", w.Name, seed+1, p.Name), func(t *testing.T) {
						synctest.Test(t, func(*testing.T) {
							log := runMatrixOnce(w, p, uint64(seed+1))
							r := measure(log)
							r.Peer, r.Seed = p.Name, uint64(seed+1)
							if seed == 0 {
								r.Series = series(log)
							}
							runs = append(runs, r)
						})
					})
				}
			}
			if len(runs) == 0 {
				continue
			}
			out = append(out, summarise(w, runs))
			if progress != nil {
				progress(out[len(out)-1])
			}
		}
	})
	return out
}

// CombineResults puts shards of a matrix of workloads together: the runs
// of each workload that any shard ran, by seed, in the order of workloads.
func CombineResults(workloads []Workload, shards ...[]WorkloadResult) []WorkloadResult {
	var out []WorkloadResult
	for _, w := range workloads {
		var runs []ThrottleResult
		for _, shard := range shards {
			for _, r := range shard {
				if r.Workload.Name == w.Name {
					runs = append(runs, r.Runs...)
				}
			}
		}
		if len(runs) > 0 {
			slices.SortStableFunc(runs, func(a, b ThrottleResult) int { return int(a.Seed) - int(b.Seed) })
			out = append(out, summarise(w, runs))
		}
	}
	return out
}

// ThrottleGoals are issue 33's goals for a limiter on each workload, against
// AWS adaptive mode through a real client, compared on the medians over the
// seeds.
type ThrottleGoals struct {
	// GoodputSlack: goodput at least AWS adaptive's minus this.
	GoodputSlack float64 `json:"goodput_slack"`
	// ThrottleShare: 429s at most this share of AWS adaptive's.
	ThrottleShare float64 `json:"throttle_share"`
	// RecoverySlack: where the capacity rises, back to 90% (see
	// ThrottleResult.RecoverySeconds) within AWS adaptive's time plus
	// this many seconds.
	RecoverySlack float64 `json:"recovery_slack_s"`
	// JainSlack: Jain's index at least AWS adaptive's minus this (only
	// where there is more than one client).
	JainSlack float64 `json:"jain_slack"`
	// WaitShare: the median wait before the first attempt under this
	// share of the deadline.
	WaitShare float64 `json:"wait_share"`
}

// IssueThrottleGoals returns the goals as issue 33 states them: goodput at
// least AWS adaptive's - 0.01, 429s at most 0.8 of its, Jain at least its -
// 0.01, back to 90% within its time + 0.5 s, and a median wait before the
// first attempt under a tenth of the deadline.
func IssueThrottleGoals() ThrottleGoals {
	return ThrottleGoals{GoodputSlack: 0.01, ThrottleShare: 0.8, RecoverySlack: 0.5, JainSlack: 0.01, WaitShare: 0.1}
}

// Goal names.
const (
	GoalGoodput  = "goodput"
	Goal429s     = "429s"
	GoalRecovery = "recovery"
	GoalFairness = "fairness"
	GoalWait     = "wait"
)

// Goals lists the goal names in the tables' order.
var Goals = []string{GoalGoodput, Goal429s, GoalRecovery, GoalFairness, GoalWait}

// GoalCheck is one goal on one workload: what the peer checked got, the
// bound it had to meet, and whether it did.
type GoalCheck struct {
	Peer     string `json:"peer"`
	Workload string `json:"workload"`
	Goal     string `json:"goal"`
	Got      Num    `json:"got"`
	Bound    Num    `json:"bound"`
	OK       bool   `json:"ok"`
	Detail   string `json:"detail"`
}

func (c GoalCheck) String() string {
	verdict := "met"
	if !c.OK {
		verdict = "NOT met"
	}
	return fmt.Sprintf("%s on %s: %s %s (%s)", c.Peer, c.Workload, c.Goal, verdict, c.Detail)
}

// CheckThrottleGoals checks the peer called ours against the goals on every
// workload it ran on, comparing medians over the seeds with PeerAWS's. A
// goal whose reference peer did not run is skipped; the wait is checked
// against the deadline alone. A test asserts the goals with:
//
//	for _, c := range bench.CheckThrottleGoals(results, "retryhttp", bench.IssueThrottleGoals()) {
//		if !c.OK {
//			t.Error(c)
//		}
//	}
func CheckThrottleGoals(results []WorkloadResult, ours string, g ThrottleGoals) []GoalCheck {
	var checks []GoalCheck
	for _, r := range results {
		me, ok := r.Peer(ours)
		if !ok {
			continue
		}
		name := r.Workload.Name
		aws, haveAWS := r.Peer(PeerAWS)
		if haveAWS {
			got, ref := float64(me.Goodput.Median), float64(aws.Goodput.Median)
			bound := ref - g.GoodputSlack
			checks = append(checks, GoalCheck{ours, name, GoalGoodput, Num(got), Num(bound), got >= bound,
				fmt.Sprintf("goodput %.3f; want >= %.3f (%s's %.3f - %g)", got, bound, PeerAWS, ref, g.GoodputSlack)})
			got, ref = float64(me.Throttled.Median), float64(aws.Throttled.Median)
			bound = g.ThrottleShare * ref
			checks = append(checks, GoalCheck{ours, name, Goal429s, Num(got), Num(bound), got <= bound,
				fmt.Sprintf("%.0f 429s; want <= %.1f (%g of %s's %.0f)", got, bound, g.ThrottleShare, PeerAWS, ref)})
			if len(r.Workload.rises()) > 0 {
				got, ref = float64(me.Recovery.Median), float64(aws.Recovery.Median)
				bound = ref + g.RecoverySlack
				checks = append(checks, GoalCheck{ours, name, GoalRecovery, Num(got), Num(bound), got <= bound,
					fmt.Sprintf("back to 90%%: %s; want <= %s (%s's %s + %g s)", fmtSeconds(got), fmtSeconds(bound), PeerAWS, fmtSeconds(ref), g.RecoverySlack)})
			}
			if len(r.Workload.Rates) > 1 {
				got, ref = float64(me.Jain.Median), float64(aws.Jain.Median)
				bound = ref - g.JainSlack
				checks = append(checks, GoalCheck{ours, name, GoalFairness, Num(got), Num(bound), got >= bound,
					fmt.Sprintf("Jain %.3f; want >= %.3f (%s's %.3f - %g)", got, bound, PeerAWS, ref, g.JainSlack)})
			}
		}
		if g.WaitShare > 0 {
			got, bound := float64(me.WaitP50Ms.Median), g.WaitShare*float64(r.Workload.Deadline.Milliseconds())
			checks = append(checks, GoalCheck{ours, name, GoalWait, Num(got), Num(bound), got < bound,
				fmt.Sprintf("wait p50 %.0f ms; want < %.0f ms (%g of the deadline)", got, bound, g.WaitShare)})
		}
	}
	return checks
}

func fmtSeconds(s float64) string {
	switch {
	case math.IsNaN(s):
		return "-"
	case math.IsInf(s, 1):
		return "never"
	}
	return strconv.FormatFloat(s, 'f', 1, 64) + " s"
}

// ThrottleMatrixTable renders the results as Markdown: one row per workload
// and peer, each measure as its median over the seeds and [min-max].
func ThrottleMatrixTable(results []WorkloadResult) string {
	var b strings.Builder
	b.WriteString("| workload | peer | goodput | goodput, last phase | 429s | back to 90% | Jain | wait p50 (ms) | not sent | server OK / caller OK |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range results {
		for _, p := range r.Peers {
			last := "-"
			if n := len(p.PhaseGoodput); n > 1 {
				last = fmtStat(p.PhaseGoodput[n-1], "%.3f")
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f / %.0f |\n",
				r.Workload.Name, p.Peer, fmtStat(p.Goodput, "%.3f"), last, fmtStat(p.Throttled, "%.0f"),
				fmtRecovery(p.Recovery), fmtStat(p.Jain, "%.3f"), fmtStat(p.WaitP50Ms, "%.0f"),
				fmtStat(p.NotSent, "%.0f"), float64(p.ServerOK.Median), float64(p.CallerOK.Median))
		}
	}
	return b.String()
}

// ThrottleGoalsTable renders one peer's goal checks (from
// CheckThrottleGoals) as Markdown: one row per workload, and a count of the
// workloads that meet each goal.
func ThrottleGoalsTable(results []WorkloadResult, checks []GoalCheck) string {
	goals := Goals
	byKey := map[string]GoalCheck{}
	for _, c := range checks {
		byKey[c.Workload+"\x00"+c.Goal] = c
	}
	met := map[string]int{}
	total := map[string]int{}
	var b strings.Builder
	b.WriteString("| workload | goodput | 429s | back to 90% | fairness | wait |\n|---|---|---|---|---|---|\n")
	for _, r := range results {
		fmt.Fprintf(&b, "| %s |", r.Workload.Name)
		for _, g := range goals {
			c, ok := byKey[r.Workload.Name+"\x00"+g]
			switch {
			case !ok:
				b.WriteString(" - |")
				continue
			case c.OK:
				met[g]++
				b.WriteString(" yes: ")
			default:
				b.WriteString(" **no**: ")
			}
			total[g]++
			b.WriteString(c.Detail + " |")
		}
		b.WriteString("\n")
	}
	b.WriteString("| **met on** |")
	for _, g := range goals {
		fmt.Fprintf(&b, " %d of %d |", met[g], total[g])
	}
	b.WriteString("\n")
	return b.String()
}

func fmtStat(s Stat, format string) string {
	med := fmt.Sprintf(format, float64(s.Median))
	if s.Min == s.Max {
		return med
	}
	return med + " [" + fmt.Sprintf(format, float64(s.Min)) + "-" + fmt.Sprintf(format, float64(s.Max)) + "]"
}

func fmtRecovery(s Stat) string {
	if math.IsNaN(float64(s.Median)) {
		return "-"
	}
	med := fmtSeconds(float64(s.Median))
	if s.Min == s.Max {
		return med
	}
	return med + " [" + fmtSeconds(float64(s.Min)) + "-" + fmtSeconds(float64(s.Max)) + "]"
}

// MergeResults adds to each of results the runs of saved's workload of the
// same name and definition by the peers that results did not run, and
// summarises them again. It lets a change to one peer be measured against
// saved runs of the others, which cost most of the time (the AWS SDK's
// waiters above all).
func MergeResults(results, saved []WorkloadResult) []WorkloadResult {
	out := make([]WorkloadResult, len(results))
	for i, r := range results {
		runs := slices.Clone(r.Runs)
		for _, s := range saved {
			if !reflect.DeepEqual(s.Workload, r.Workload) {
				continue
			}
			for _, run := range s.Runs {
				if _, ran := r.Peer(run.Peer); !ran {
					runs = append(runs, run)
				}
			}
		}
		out[i] = summarise(r.Workload, runs)
	}
	return out
}
