// Package herd models a thundering herd of retrying clients, with the very
// backoff code the Transport uses (internal/backoff, which retryhttp.Jitter draws from), so that the
// library's claims about jitter, budgets and layering are shown with its own
// code rather than a second implementation of it. See docs/herd.md.
package herd

import (
	"container/heap"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/herdproof/retryhttp/internal/backoff"
)

// Model is the herd of the AWS Architecture Blog's "Exponential Backoff and
// Jitter": Clients all make their first attempt at t = 0; the server rejects
// everything before Outage, then admits the first Capacity arrivals of each
// Window-long window [k·Window, (k+1)·Window) and rejects the rest. Every
// client retries until it succeeds, waiting Schedule.Delay(n, Base, Cap,
// previous wait) before retry n, with no budget.
type Model struct {
	Clients  int
	Outage   time.Duration
	Window   time.Duration
	Capacity int
	Base     time.Duration
	Cap      time.Duration
}

// Standard is the brief's herd: 1,000 clients, 10 s down, then 100 per
// second, base 1 s, cap 30 s.
var Standard = Model{Clients: 1000, Outage: 10 * time.Second, Window: time.Second, Capacity: 100, Base: time.Second, Cap: 30 * time.Second}

// Result is one run of the model.
type Result struct {
	// Retries counts attempts after each client's first.
	Retries int
	// Rejected counts failed attempts at or after the end of the outage.
	Rejected int
	// Peak is the most arrivals in one window after the outage.
	Peak int
	// Last is when the last client succeeded.
	Last time.Duration
	// Arrivals counts attempts per window: Arrivals[k] fell in
	// [k·Window, (k+1)·Window).
	Arrivals []int
	// Attempts holds each client's attempt times, in order; the last one
	// succeeded.
	Attempts [][]time.Duration
}

// Ideal is when the last client would succeed if the clients came back in
// perfect order: the outage, then Clients/Capacity full windows.
func (m Model) Ideal() time.Duration {
	return m.Outage + time.Duration((m.Clients+m.Capacity-1)/m.Capacity)*m.Window
}

// Run runs the model under one schedule. rnd draws the jitter (uniform in
// [0, n)); events at the same instant are served in client order, so a run
// is a pure function of the schedule and rnd's sequence.
func (m Model) Run(schedule backoff.Jitter, rnd func(int64) int64) Result {
	res := Result{Attempts: make([][]time.Duration, m.Clients)}
	admitted := map[int64]int{}
	prev := make([]time.Duration, m.Clients)
	q := make(events, 0, m.Clients)
	for c := range m.Clients {
		q = append(q, event{at: 0, client: c})
	}
	heap.Init(&q)
	for q.Len() > 0 {
		e := heap.Pop(&q).(event)
		res.Attempts[e.client] = append(res.Attempts[e.client], e.at)
		n := len(res.Attempts[e.client]) // attempts so far
		if n > 1 {
			res.Retries++
		}
		w := int64(e.at / m.Window)
		for int64(len(res.Arrivals)) <= w {
			res.Arrivals = append(res.Arrivals, 0)
		}
		res.Arrivals[w]++
		if e.at >= m.Outage {
			if admitted[w] < m.Capacity {
				admitted[w]++
				res.Last = max(res.Last, e.at)
				continue
			}
			res.Rejected++
		}
		d := schedule.Delay(n-1, m.Base, m.Cap, prev[e.client], rnd)
		prev[e.client] = d
		heap.Push(&q, event{at: e.at + d, client: e.client})
	}
	first := int(m.Outage / m.Window)
	for _, a := range res.Arrivals[min(first, len(res.Arrivals)):] {
		res.Peak = max(res.Peak, a)
	}
	return res
}

type event struct {
	at     time.Duration
	client int
}

// events is a min-heap by time, then client.
type events []event

func (q events) Len() int { return len(q) }
func (q events) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].client < q[j].client
}
func (q events) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *events) Push(x any)   { *q = append(*q, x.(event)) }
func (q *events) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}

// Rand returns the reproducible random source of seed: the same seed gives
// the same sequence for every schedule.
func Rand(seed uint64) func(int64) int64 {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15)).Int64N
}

// Stats summarises one figure over many seeds.
type Stats struct {
	Mean   float64 `json:"mean"`
	P5     float64 `json:"p5"`
	Median float64 `json:"median"`
	P95    float64 `json:"p95"`
}

// Summarize returns the mean and the 5th, 50th and 95th percentiles (nearest
// rank) of xs.
func Summarize(xs []float64) Stats {
	if len(xs) == 0 {
		return Stats{}
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	sum := 0.0
	for _, x := range s {
		sum += x
	}
	rank := func(p float64) float64 {
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	return Stats{Mean: sum / float64(len(s)), P5: rank(0.05), Median: rank(0.5), P95: rank(0.95)}
}

// ScheduleSummary is the summary of one schedule over many seeds.
type ScheduleSummary struct {
	Name        string `json:"name"`
	Retries     Stats  `json:"retries"`
	Rejected    Stats  `json:"rejected"`
	Peak        Stats  `json:"peak"`
	LastSeconds Stats  `json:"last_seconds"`
}

// Schedules are the four schedules compared, in the order reported.
var Schedules = []backoff.Jitter{backoff.None, backoff.Full, backoff.Equal, backoff.Decorrelated}

// Summary runs the model for seeds 0..seeds-1 under every schedule.
func (m Model) Summary(seeds int) []ScheduleSummary {
	var out []ScheduleSummary
	for _, j := range Schedules {
		var retries, rejected, peak, last []float64
		for seed := range seeds {
			r := m.Run(j, Rand(uint64(seed)))
			retries = append(retries, float64(r.Retries))
			rejected = append(rejected, float64(r.Rejected))
			peak = append(peak, float64(r.Peak))
			last = append(last, r.Last.Seconds())
		}
		out = append(out, ScheduleSummary{Name: j.String(), Retries: Summarize(retries),
			Rejected: Summarize(rejected), Peak: Summarize(peak), LastSeconds: Summarize(last)})
	}
	return out
}
