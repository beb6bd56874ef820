package main

import (
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
