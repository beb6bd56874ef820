package main

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/herd"
)

// server is the herd's dependency: down until the outage ends, then the
// first Capacity arrivals of each window succeed and the rest get 503. Time
// runs scaled: one model second is scale of wall-clock time.
type server struct {
	m     herd.Model
	scale time.Duration

	mu       sync.Mutex
	start    time.Time
	arrivals []int
	admitted map[int]int
	last     time.Duration // model time of the last success
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	t := time.Duration(float64(time.Since(s.start)) * float64(time.Second) / float64(s.scale)) // model time
	k := int(t / s.m.Window)
	for len(s.arrivals) <= k {
		s.arrivals = append(s.arrivals, 0)
	}
	s.arrivals[k]++
	ok := t >= s.m.Outage && s.admitted[k] < s.m.Capacity
	if ok {
		s.admitted[k]++
		s.last = max(s.last, t)
	}
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

type outcome struct {
	name      string
	arrivals  []int
	succeeded int
	last      time.Duration
}

func runReal(scale time.Duration) {
	m := herd.Standard
	fmt.Printf("1,000 clients over loopback, the real Transport. The server is down for %v, then serves %d a second.\n", m.Outage, m.Capacity)
	fmt.Printf("Time is scaled: 1 model second = %v of wall clock. Ideal: everyone back at %v.\n", scale, m.Ideal())

	s := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * float64(scale) / float64(time.Second))
	}
	forever := retryhttp.Policy{MaxAttempts: 1 << 30, BaseDelay: s(m.Base), MaxDelay: s(m.Cap)}
	runs := []struct {
		name   string
		policy retryhttp.Policy
		budget *retryhttp.Budget
	}{
		{"no jitter, no budget", withJitter(forever, retryhttp.NoJitter), retryhttp.UnlimitedBudget()},
		{"full jitter, no budget", withJitter(forever, retryhttp.FullJitter), retryhttp.UnlimitedBudget()},
		{"full jitter, default budget, 3 attempts", retryhttp.Policy{BaseDelay: s(m.Base), MaxDelay: s(m.Cap)}, nil},
	}
	var results []outcome
	for i, run := range runs {
		fmt.Printf("\nrun %d of %d: %s ...\n", i+1, len(runs), run.name)
		o := herdOnce(m, scale, run.policy, run.budget)
		o.name = run.name
		results = append(results, o)
		fmt.Printf("%s", chart(o.arrivals, m))
	}

	fmt.Printf("\nAfter the %v outage (attempts during it are all rejected and not counted in those columns):\n", m.Outage)
	fmt.Printf("%-40s %8s %9s %14s %16s %10s\n", "run", "retries", "rejected", "peak/capacity", "last back (s)", "gave up")
	for _, o := range results {
		retries, rejected, peak := 0, 0, 0
		for k, a := range o.arrivals {
			retries += a
			if time.Duration(k)*m.Window >= m.Outage {
				peak = max(peak, a)
			}
		}
		retries -= m.Clients
		rejected = retries + m.Clients - o.succeeded - outageAttempts(o.arrivals, m)
		last := "-" // nobody came back
		if o.succeeded > 0 {
			last = fmt.Sprintf("%.0f", o.last.Seconds())
		}
		fmt.Printf("%-40s %8d %9d %13.1fx %16s %10d\n", o.name, retries, rejected, float64(peak)/float64(m.Capacity), last, m.Clients-o.succeeded)
	}
	fmt.Printf("%-40s %8s %9s %13.1fx %16.0f %10d\n", "ideal", "-", "0", 1.0, m.Ideal().Seconds(), 0)
	fmt.Println(`
Without jitter the herd comes back in lock step: every burst is the whole
herd, the server admits 100 and rejects the rest, and the stragglers wait
30 s between bursts. (The model gives exactly 1,000 per burst and the last
client back at 271 s; here each burst is spread a little by the time the
machine takes to serve it, which is natural jitter.) Full jitter spreads the
retries so they arrive near the capacity soon after the outage. With 3
attempts every client gives up during the outage, budget or not, so the
peak after it is the same; what the default budget changes is the retries:
3 attempts alone would send 2,000 into the outage, the budget's 500 tokens
pay for 35, then every client fails fast and its caller decides, which is
what a budget is for. go run ./examples/herd -model gives the exact
figures.`)
}

func withJitter(p retryhttp.Policy, j retryhttp.Jitter) retryhttp.Policy {
	p.Jitter = j
	return p
}

// outageAttempts counts the arrivals during the outage, all rejected.
func outageAttempts(arrivals []int, m herd.Model) int {
	n := 0
	for k := 0; k < len(arrivals) && time.Duration(k)*m.Window < m.Outage; k++ {
		n += arrivals[k]
	}
	return n
}

func herdOnce(m herd.Model, scale time.Duration, p retryhttp.Policy, budget *retryhttp.Budget) outcome {
	srv := &server{m: m, scale: scale, admitted: map[int]int{}}
	ts := httptest.NewUnstartedServer(srv)
	ts.Config.ErrorLog = log.New(io.Discard, "", 0)
	ts.Start()
	defer ts.Close()
	// Enough idle connections for the whole herd, so that retries reuse
	// them instead of opening new ones.
	base := &http.Transport{MaxIdleConns: m.Clients, MaxIdleConnsPerHost: m.Clients}
	defer base.CloseIdleConnections()
	tr := &retryhttp.Transport{Base: base, Policy: p, Budget: budget}
	client := &http.Client{Transport: tr}

	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	srv.start = time.Now()
	for range m.Clients {
		wg.Go(func() {
			resp, err := client.Get(ts.URL)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return outcome{arrivals: srv.arrivals, succeeded: ok, last: srv.last}
}

// chart draws arrivals per second as columns, with the capacity as a line.
// A column covers one or more seconds and shows the busiest of them.
func chart(arrivals []int, m herd.Model) string {
	const width, height = 72, 10
	per := (len(arrivals) + width - 1) / width
	var cols []int
	for i := 0; i < len(arrivals); i += per {
		peak := 0
		for _, a := range arrivals[i:min(i+per, len(arrivals))] {
			peak = max(peak, a)
		}
		cols = append(cols, peak)
	}
	top := m.Capacity
	for _, c := range cols {
		top = max(top, c)
	}
	var b strings.Builder
	capRow := (m.Capacity*height + top - 1) / top // the row the capacity falls in
	for row := height; row >= 1; row-- {
		label := "     "
		switch row {
		case height:
			label = fmt.Sprintf("%5d", top)
		case capRow:
			label = fmt.Sprintf("%5d", m.Capacity)
		}
		b.WriteString(label + " │")
		for _, c := range cols {
			switch {
			case c*height >= row*top-top/2: // rounded to the nearest row
				b.WriteString("█")
			case row == capRow:
				b.WriteString("─")
			default:
				b.WriteString(" ")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("    0 └" + strings.Repeat("─", len(cols)) + "\n")
	end := fmt.Sprintf("%ds", len(arrivals))
	b.WriteString("       0s" + strings.Repeat(" ", max(1, len(cols)-2-len(end))) + end + "   (arrivals per second; ─ capacity)\n")
	return b.String()
}
