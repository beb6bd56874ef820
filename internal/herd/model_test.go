package herd

import (
	"reflect"
	"testing"
	"time"

	"github.com/herdproof/retryhttp/internal/backoff"
)

func TestNoJitterIsExact(t *testing.T) {
	r := Standard.Run(backoff.None, Rand(0))
	s := time.Second
	// Every client: 0, 1, 3, 7 (outage), then 15, 31, 61, 91 ... until admitted.
	want := []time.Duration{0, 1 * s, 3 * s, 7 * s, 15 * s, 31 * s, 61 * s, 91 * s, 121 * s, 151 * s, 181 * s, 211 * s, 241 * s, 271 * s}
	if got := r.Attempts[999]; !reflect.DeepEqual(got, want) {
		t.Errorf("last client: got attempts at %v; want %v", got, want)
	}
	if got := r.Attempts[0]; !reflect.DeepEqual(got, want[:5]) {
		t.Errorf("first client: got attempts at %v; want %v", got, want[:5])
	}
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"retries", r.Retries, 8500},
		{"rejected", r.Rejected, 4500},
		{"peak", r.Peak, 1000},
		{"last (s)", int(r.Last / s), 271},
	} {
		if c.got != c.want {
			t.Errorf("%s: got %d; want %d", c.name, c.got, c.want)
		}
	}
	if Standard.Ideal() != 20*s {
		t.Errorf("ideal: got %v; want 20s", Standard.Ideal())
	}
}

func TestJitteredInvariants(t *testing.T) {
	m := Standard
	for _, j := range Schedules[1:] {
		t.Run(j.String(), func(t *testing.T) {
			r := m.Run(j, Rand(42))
			if again := m.Run(j, Rand(42)); !reflect.DeepEqual(r, again) {
				t.Fatal("the same seed gave two different runs")
			}
			if other := m.Run(j, Rand(43)); reflect.DeepEqual(r.Attempts, other.Attempts) {
				t.Error("two seeds gave the same run")
			}
			attempts := 0
			for c, as := range r.Attempts {
				attempts += len(as)
				last := as[len(as)-1]
				if last < m.Outage {
					t.Fatalf("client %d succeeded at %v, during the outage", c, last)
				}
				prev := time.Duration(0)
				for n := 1; n < len(as); n++ {
					wait := as[n] - as[n-1]
					lo, hi := window(j, n-1, m.Base, m.Cap, prev)
					if wait < lo || wait > hi {
						t.Fatalf("client %d, retry %d: waited %v; want within [%v, %v]", c, n-1, wait, lo, hi)
					}
					prev = wait
				}
			}
			if r.Retries != attempts-m.Clients {
				t.Errorf("got %d retries; want attempts - clients = %d", r.Retries, attempts-m.Clients)
			}
			sum := 0
			for _, a := range r.Arrivals {
				sum += a
			}
			if sum != attempts {
				t.Errorf("arrivals add up to %d; want %d", sum, attempts)
			}
			if r.Last < m.Ideal()-m.Window {
				t.Errorf("last client at %v: before the ideal %v allows", r.Last, m.Ideal())
			}
		})
	}
}

// window is the range a schedule may draw retry n from.
func window(j backoff.Jitter, n int, base, limit, prev time.Duration) (time.Duration, time.Duration) {
	t := min(limit, base<<min(n, 40))
	switch j {
	case backoff.Full:
		return 0, t
	case backoff.Equal:
		return t / 2, t
	case backoff.Decorrelated:
		if prev == 0 {
			prev = base
		}
		return base, min(limit, 3*prev)
	}
	return t, t
}

func TestSummarize(t *testing.T) {
	xs := make([]float64, 100)
	for i := range xs {
		xs[i] = float64(100 - i) // 100 .. 1
	}
	got := Summarize(xs)
	want := Stats{Mean: 50.5, P5: 5, Median: 50, P95: 95}
	if got != want {
		t.Errorf("got %+v; want %+v", got, want)
	}
}
