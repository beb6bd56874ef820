package main

import (
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
	m := herd.Model{Clients: 50, Outage: 2 * time.Second, Window: time.Second, Capacity: 10, Base: time.Second, Cap: 4 * time.Second}
	scale := 20 * time.Millisecond
	p := retryhttp.Policy{MaxAttempts: 1 << 30, BaseDelay: scale, MaxDelay: 4 * scale}
	o := herdOnce(m, scale, p, retryhttp.UnlimitedBudget())
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
