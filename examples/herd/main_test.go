package main

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/herd"
)

// A small herd over loopback, fast: every client gets through, and the
// server counted every attempt.
func TestSmallRealHerd(t *testing.T) {
	m := herd.Model{Clients: 50, Outage: 10 * time.Second, Window: time.Second, Capacity: 10, Base: time.Second, Cap: 4 * time.Second}
	scale := 20 * time.Millisecond
	p := retryhttp.Policy{MaxAttempts: 1 << 30, BaseDelay: scale, MaxDelay: 4 * scale}
	o := herdOnce(m, scale, p, herd.Unlimited(), nil)
	if o.succeeded != m.Clients {
		t.Errorf("got %d clients through; want %d", o.succeeded, m.Clients)
	}
	total := 0
	for _, a := range o.arrivals {
		total += a
	}
	if total < m.Clients+m.Clients { // everyone failed at least once, in the outage
		t.Errorf("got %d attempts; want at least %d", total, 2*m.Clients)
	}
	if o.last < m.Outage {
		t.Errorf("last success at %v; want after the %v outage", o.last, m.Outage)
	}
}

func TestChart(t *testing.T) {
	m := herd.Model{Capacity: 100}
	got := chart([]int{1000, 0, 100, 20}, m)
	lines := strings.Split(got, "\n")
	if !strings.HasPrefix(lines[0], " 1000 │█   ") {
		t.Errorf("top row: got %q; want the 1000 column alone", lines[0])
	}
	if !strings.HasPrefix(lines[9], "  100 │█─█─") {
		t.Errorf("capacity row: got %q; want the line between the columns", lines[9])
	}
}

func TestLayersJSON(t *testing.T) {
	chains, mixed := herd.SignalChains(200)
	if len(chains) != 16 {
		t.Fatalf("got %d chains; want 16 (k = 1..4, signal off and on, down and flaky)", len(chains))
	}
	for _, c := range chains {
		if c.Bottom != "down" {
			continue
		}
		want := 3.0
		if !c.Signal {
			want = math.Pow(3, float64(c.Layers))
		}
		if c.AttemptsPerRequest != want || c.SuccessRate != 0 {
			t.Errorf("k = %d, signal %v, down: got %.2f attempts a request and %.2f success; want %.0f and 0", c.Layers, c.Signal, c.AttemptsPerRequest, c.SuccessRate, want)
		}
	}
	for i := 8; i < 16; i += 2 {
		off, on := chains[i], chains[i+1]
		if on.AttemptsPerRequest > off.AttemptsPerRequest {
			t.Errorf("k = %d, flaky: got %.2f attempts a request with the signal, %.2f without; want no more", on.Layers, on.AttemptsPerRequest, off.AttemptsPerRequest)
		}
	}
	for _, m := range mixed {
		want := 9.0
		if m.Without == 1 {
			want = 3
		}
		if m.AttemptsPerRequest != want {
			t.Errorf("layer %d without the middleware: got %.0f attempts a request; want %.0f", m.Without, m.AttemptsPerRequest, want)
		}
	}
}

func ptr(x float64) *float64 { return &x }

// The sentences follow the figures, whichever way they fall: a loaded
// machine once gave full jitter a higher peak than no jitter.
func TestConclusionsFollowTheNumbers(t *testing.T) {
	m := herd.Standard
	budget := runResult{Name: "budget", Clients: 1000, Retries: 35, GaveUp: 1000}
	tests := []struct {
		name      string
		runs      demoRuns
		want, not []string
	}{
		{"jitter lower", demoRuns{
			None:   runResult{PeakRatio: 10.0, LastBack: ptr(153), RejectedAfter: 2500},
			Full:   runResult{PeakRatio: 1.6, LastBack: ptr(42), RejectedAfter: 108},
			Budget: budget},
			[]string{"peaked at 1.6x the capacity with full jitter and 10.0x without jitter: jitter spread the herd out.",
				"back at 42 s with full jitter, sooner than without jitter (153 s)",
				"rejected 108 attempts with full jitter, fewer than without jitter (2500)",
				"every client gave up", "paid for 35 retries", "would send 2000"},
			[]string{"did not"}},
		{"jitter higher (a loaded machine)", demoRuns{
			None:   runResult{PeakRatio: 7.4, LastBack: ptr(40), RejectedAfter: 900},
			Full:   runResult{PeakRatio: 10.6, LastBack: ptr(61), RejectedAfter: 1200, TimerLate: 0.9},
			Budget: runResult{Clients: 1000, Retries: 40, GaveUp: 990}},
			[]string{"peaked at 10.6x the capacity with full jitter and 7.4x without jitter: in this run jitter did not spread the herd out, its peak was the higher.",
				"back at 61 s with full jitter, later than without jitter (40 s)",
				"rejected 1200 attempts with full jitter, more than without jitter (900)",
				"990 of 1000 clients gave up",
				"up to 0.90 model seconds late (99th percentile): the machine was too busy"},
			[]string{"spread the herd out.", "sooner", "every client"}},
		{"equal as printed", demoRuns{
			None:   runResult{PeakRatio: 2.04, LastBack: ptr(40.2), RejectedAfter: 5},
			Full:   runResult{PeakRatio: 1.96, LastBack: ptr(39.9), RejectedAfter: 5},
			Budget: runResult{Clients: 1000, GaveUp: 0}},
			[]string{"2.0x the capacity with full jitter and 2.0x without jitter: in this run jitter did not lower the peak.",
				"as late as without jitter", "as many as", "no client gave up", "up to 0.00 model seconds late (99th percentile), under half a model second"},
			[]string{"too busy"}},
		{"nobody back without jitter", demoRuns{
			None:   runResult{PeakRatio: 0, GaveUp: 1000},
			Full:   runResult{PeakRatio: 1.5, LastBack: ptr(41)},
			Budget: budget},
			[]string{"With full jitter the last client was back at 41 s; without jitter, 1000 clients never were."},
			nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := strings.Join(conclusions(m, tt.runs), "\n")
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("got\n%s\nwant it to say %q", got, w)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(got, n) {
					t.Errorf("got\n%s\nwant it not to say %q", got, n)
				}
			}
		})
	}
}

// The table's columns say what they count: retries include the outage's.
func TestTable(t *testing.T) {
	m := herd.Standard
	o := outcome{arrivals: make([]int, 12), succeeded: 2, last: 11 * time.Second}
	o.arrivals[0], o.arrivals[3], o.arrivals[10], o.arrivals[11] = 1000, 500, 250, 2 // 1,752 attempts
	r := summarize("run", m, o)
	if r.Retries != 752 || r.OutageAttempts != 1500 || r.RejectedAfter != 250 || r.Peak != 250 || r.GaveUp != 998 {
		t.Errorf("got retries %d, in outage %d, rejected after %d, peak %d, gave up %d; want 752, 1500, 250, 250, 998",
			r.Retries, r.OutageAttempts, r.RejectedAfter, r.Peak, r.GaveUp)
	}
	got := table(m, []runResult{r})
	for _, w := range []string{"in outage", "after the outage:", "retries: every attempt after a client's first"} {
		if !strings.Contains(got, w) {
			t.Errorf("got\n%s\nwant %q", got, w)
		}
	}
}

func TestRefusingUntil(t *testing.T) {
	one := 1
	for _, tt := range []struct {
		in   *int
		want string
	}{{nil, "never"}, {&one, "1 s after"}} {
		if got := refusingUntil(tt.in); got != tt.want {
			t.Errorf("refusingUntil(%v): got %q; want %q", tt.in, got, tt.want)
		}
	}
}

// The sentences round as the table prints: 3.65 is 3.6 in both.
func TestConclusionsRoundAsTheTable(t *testing.T) {
	m := herd.Standard
	r := demoRuns{
		None:   runResult{PeakRatio: 3.27, LastBack: ptr(37.5)},
		Full:   runResult{PeakRatio: 3.65, LastBack: ptr(45.5)},
		Budget: runResult{Clients: 1000, GaveUp: 1000},
	}
	got := strings.Join(conclusions(m, r), "\n")
	tab := table(m, []runResult{r.None, r.Full})
	for _, w := range []string{fmt.Sprintf("%.1fx", r.Full.PeakRatio), fmt.Sprintf("%.0f", *r.Full.LastBack), fmt.Sprintf("%.0f", *r.None.LastBack)} {
		if !strings.Contains(tab, w) || !strings.Contains(got, w) {
			t.Errorf("want %q in both the table and the sentences; got table\n%s\nsentences\n%s", w, tab, got)
		}
	}
}
