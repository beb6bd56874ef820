package main

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	ok       int
	last     time.Duration // model time of the last success
}

// model converts a wall-clock duration to model time.
func (s *server) model(d time.Duration) time.Duration {
	return time.Duration(float64(d) * float64(time.Second) / float64(s.scale))
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	t := s.model(time.Since(s.start))
	k := int(t / s.m.Window)
	for len(s.arrivals) <= k {
		s.arrivals = append(s.arrivals, 0)
	}
	s.arrivals[k]++
	ok := t >= s.m.Outage && s.admitted[k] < s.m.Capacity
	if ok {
		s.admitted[k]++
		s.ok++
		s.last = max(s.last, t)
	}
	s.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
}

// outcome is what one run of the real herd saw at the server.
type outcome struct {
	arrivals  []int
	succeeded int
	last      time.Duration // model time of the last success
	late      time.Duration // the latest a timer fired, in model time
	wall      time.Duration
}

func runReal(scale time.Duration, asJSON bool) {
	m := herd.Standard
	progress := io.Writer(os.Stdout)
	if asJSON {
		progress = os.Stderr
	}
	fmt.Fprintf(progress, "1,000 clients over loopback, the real Transport. The server is down for %v, then serves %d a second.\n", m.Outage, m.Capacity)
	fmt.Fprintf(progress, "Time is scaled: 1 model second = %v of wall clock. Ideal: everyone back at %v.\n", scale, m.Ideal())

	s := func(d time.Duration) time.Duration {
		return time.Duration(float64(d) * float64(scale) / float64(time.Second))
	}
	forever := retryhttp.Policy{MaxAttempts: 1 << 30, BaseDelay: s(m.Base), MaxDelay: s(m.Cap)}
	runs := []struct {
		name   string
		policy retryhttp.Policy
		budget retryhttp.Budget
	}{
		{"no jitter, no budget", noJitter(forever), herd.Unlimited()},
		{"full jitter, no budget", forever, herd.Unlimited()},
		{"full jitter, default budget, 3 attempts", retryhttp.Policy{BaseDelay: s(m.Base), MaxDelay: s(m.Cap)}, nil},
	}
	var results []runResult
	start := time.Now()
	for i, run := range runs {
		fmt.Fprintf(progress, "\nrun %d of %d: %s\n", i+1, len(runs), run.name)
		o := herdOnce(m, scale, run.policy, run.budget, progress)
		results = append(results, summarize(run.name, m, o))
		if !asJSON {
			fmt.Printf("%s", chart(o.arrivals, m))
		}
	}
	herdRuns := demoRuns{None: results[0], Full: results[1], Budget: results[2]}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		err := enc.Encode(map[string]any{
			"clients": m.Clients, "capacity": m.Capacity, "outage_seconds": m.Outage.Seconds(),
			"ideal_seconds": m.Ideal().Seconds(), "scale_seconds": scale.Seconds(),
			"wall_seconds": time.Since(start).Seconds(), "runs": results,
			"conclusions": conclusions(m, herdRuns),
		})
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	fmt.Println()
	fmt.Print(table(m, results))
	fmt.Println()
	for _, c := range conclusions(m, herdRuns) {
		fmt.Println(wrap(c, 76))
	}
	fmt.Println(wrap("go run ./examples/herd -model runs the same herd in virtual time, over many seeds; docs/herd.md explains both.", 76))
}

// noJitter makes p wait the top of each full-jitter window, min(MaxDelay,
// BaseDelay·2^n): exactly what no jitter waits.
func noJitter(p retryhttp.Policy) retryhttp.Policy {
	p.Rand = func(n int64) int64 { return n - 1 }
	return p
}

// herdOnce runs the herd against a server of its own and returns what the
// server saw. It writes a line of progress to progress (if not nil) every
// 20 model seconds, and measures how late timers fire meanwhile.
func herdOnce(m herd.Model, scale time.Duration, p retryhttp.Policy, budget retryhttp.Budget, progress io.Writer) outcome {
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
	var done atomic.Int64
	stop := make(chan struct{})
	watch := startWatch(stop, srv, m, scale, progress, &done)
	srv.mu.Lock() // ServeHTTP reads it under the lock
	srv.start = time.Now()
	srv.mu.Unlock()
	for range m.Clients {
		wg.Go(func() {
			defer done.Add(1)
			resp, err := client.Get(ts.URL)
			if err != nil {
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		})
	}
	wg.Wait()
	close(stop)
	late := <-watch
	srv.mu.Lock()
	defer srv.mu.Unlock()
	return outcome{arrivals: srv.arrivals, succeeded: srv.ok, last: srv.last,
		late: srv.model(late), wall: time.Since(srv.start)}
}

// startWatch prints progress every 20 model seconds and measures how late
// a 10 ms timer fires, until stop is closed; then it sends the 99th
// percentile of the lateness (a single pause, a GC or a burst of requests,
// does not count; a machine that keeps timers waiting does).
func startWatch(stop chan struct{}, srv *server, m herd.Model, scale time.Duration, progress io.Writer, done *atomic.Int64) chan time.Duration {
	out := make(chan time.Duration, 1)
	go func() {
		const tick = 10 * time.Millisecond
		var late []time.Duration
		every := 20 * scale
		next := every
		begin := time.Now()
		for {
			select {
			case <-stop:
				slices.Sort(late)
				p99 := time.Duration(0)
				if len(late) > 0 {
					p99 = late[len(late)*99/100]
				}
				out <- p99
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(tick)
			late = append(late, time.Since(t0)-tick)
			if progress != nil && time.Since(begin) >= next {
				srv.mu.Lock()
				ok, attempts := srv.ok, 0
				for _, a := range srv.arrivals {
					attempts += a
				}
				srv.mu.Unlock()
				fmt.Fprintf(progress, "  t = %3.0f s: %4d of %d clients back, %d gave up, %d attempts so far\n",
					srv.model(time.Since(begin)).Seconds(), ok, m.Clients, int(done.Load())-ok, attempts)
				next += every
			}
		}
	}()
	return out
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
