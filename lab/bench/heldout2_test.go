package bench

import (
	"math"
	"testing"
	"testing/synctest"
	"time"
)

// shrink scales a workload's times (its steps, starts and duration) so
// that it lasts d: a CI-sized copy of the same shape.
func shrink(w Workload, d time.Duration) Workload {
	f := float64(d) / float64(w.Duration)
	scale := func(steps []Step) []Step {
		out := make([]Step, len(steps))
		for i, s := range steps {
			out[i] = Step{time.Duration(float64(s.At) * f), s.Rate}
		}
		return out
	}
	w.Capacity = scale(w.Capacity)
	if w.Demand != nil {
		w.Demand = scale(w.Demand)
	}
	if w.Starts != nil {
		starts := make([]time.Duration, len(w.Starts))
		for i, s := range w.Starts {
			starts[i] = time.Duration(float64(s) * f)
		}
		w.Starts = starts
	}
	w.Duration = d
	return w
}

func TestHeldOutWorkloads2Shapes(t *testing.T) {
	ws := HeldOutWorkloads2()
	if len(ws) != 6 {
		t.Fatalf("got %d workloads; want 6", len(ws))
	}
	names := map[string]bool{}
	for _, w := range HeldOutWorkloads() {
		names[w.Name] = true
	}
	for _, w := range ThrottleMatrix() {
		names[w.Name] = true
	}
	for _, w := range ws {
		if names[w.Name] {
			t.Errorf("%s: got a name of the matrix or HeldOutWorkloads; want a new one", w.Name)
		}
		names[w.Name] = true
	}
	for _, tc := range []struct {
		name string
		got  float64
		want float64
	}{
		// The sine: 200 + 100 sin, sampled at each second's middle.
		{"sine's first step", ws[0].Capacity[0].Rate, math.Round(200 + 100*math.Sin(2*math.Pi*0.5/20))},
		{"sine's step at 15 s", ws[0].Capacity[15].Rate, math.Round(200 + 100*math.Sin(2*math.Pi*15.5/20))},
		// Sampled at the middle of each second, it peaks a little inside
		// 100 and 300: at 4.5 s and 14.5 s.
		{"sine's least", minRate(ws[0].Capacity), math.Round(200 - 100*math.Sin(2*math.Pi*4.5/20))},
		{"sine's most", -minRate(negate(ws[0].Capacity)), math.Round(200 + 100*math.Sin(2*math.Pi*4.5/20))},
		// Bursts: 1 s at 5x of 200/s, 6 times in 30 s.
		{"bursts' attainable", ws[1].attainable(0, ws[1].Duration), 6 * 200},
		// The decline: 300 at 0, 200 at 15 s, 100 from 30 s.
		{"decline at 15 s", rateAt(ws[2], 15*time.Second), 200},
		{"decline at 40 s", rateAt(ws[2], 40*time.Second), 100},
		{"decline's rises", float64(len(ws[2].rises())), 0},
		// The late join: 200 of the 300/s offered by the heavy client
		// alone; then 200 of 500.
		{"latejoin's offered at 14.9 s", ws[5].offeredAt(14900 * time.Millisecond), 300},
		{"latejoin's offered at 15 s", ws[5].offeredAt(15 * time.Second), 500},
		{"latejoin's attainable", ws[5].attainable(0, ws[5].Duration), 40 * 200},
	} {
		if math.Abs(tc.got-tc.want) > 1e-9 {
			t.Errorf("%s: got %v; want %v", tc.name, tc.got, tc.want)
		}
	}
}

func minRate(steps []Step) float64 {
	m := math.Inf(1)
	for _, s := range steps {
		m = min(m, s.Rate)
	}
	return m
}

func negate(steps []Step) []Step {
	out := make([]Step, len(steps))
	for i, s := range steps {
		out[i] = Step{s.At, -s.Rate}
	}
	return out
}

func rateAt(w Workload, d time.Duration) float64 {
	r, _ := w.capacityAt(d)
	return r
}

// TestPausedDemandAndLateStarts runs clients whose demand pauses and who
// start late: no call is made before a client's start or while the demand
// is paused.
func TestPausedDemandAndLateStarts(t *testing.T) {
	s := time.Second
	w := Workload{Name: "pauses", Capacity: steady(1000), Deadline: s, Rates: []float64{50, 50},
		Demand: []Step{{0, 1}, {s, 0}, {3 * s, 2}, {4 * s, 0}}, Starts: []time.Duration{0, 3500 * time.Millisecond},
		Duration: 6 * s}
	synctest.Test(t, func(t *testing.T) {
		log := runMatrixOnce(w, RetryHTTPPeer(PeerNone, nil), 1)
		per := []int{0, 0}
		for _, c := range log.calls {
			per[c.client]++
			paused := c.start >= s && c.start < 3*s || c.start >= 4*s
			if paused || c.start < w.Starts[c.client] {
				t.Errorf("client %d: got a call at %v; want none before %v, in [1s, 3s) or from 4s", c.client, c.start, w.Starts[c.client])
			}
		}
		// About 50 + 100 calls for the first client, 50 for the second.
		if per[0] < 100 || per[0] > 200 || per[1] < 20 || per[1] > 80 {
			t.Errorf("got %v calls per client; want about [150 50]", per)
		}
	})
}

// TestHeldOutWorkloads2Smoke runs every peer on each held-out workload of
// the second set, shrunk to 4 s, one seed: each builds and runs, every
// peer made the same calls, and the counts add up.
func TestHeldOutWorkloads2Smoke(t *testing.T) {
	peers := DefaultThrottlePeers()
	var ws []Workload
	for _, w := range HeldOutWorkloads2() {
		ws = append(ws, shrink(w, 4*time.Second))
	}
	results := RunThrottleMatrix(t, ws, peers, 1, nil)
	if len(results) != len(ws) {
		t.Fatalf("got %d results; want %d", len(results), len(ws))
	}
	for _, r := range results {
		calls := r.Runs[0].Calls
		for _, run := range r.Runs {
			name := r.Workload.Name + "/" + run.Peer
			if run.Calls == 0 || run.Calls != calls {
				t.Errorf("%s: got %d calls; %s made %d: want the same arrivals, some", name, run.Calls, r.Runs[0].Peer, calls)
			}
			if run.ServerOK+run.Throttled != run.Attempts || run.CallerOK > run.ServerOK || run.NotSent > run.Calls {
				t.Errorf("%s: got %d attempts, %d 2xx, %d 429s, %d seen by callers, %d of %d not sent: do not add up",
					name, run.Attempts, run.ServerOK, run.Throttled, run.CallerOK, run.NotSent, run.Calls)
			}
			if run.Goodput <= 0 || run.Jain <= 0 || run.Jain > 1 {
				t.Errorf("%s: got goodput %v, Jain %v: out of range", name, run.Goodput, run.Jain)
			}
		}
	}
	if checks := CheckThrottleGoals(results, PeerRetryHTTP, IssueThrottleGoals()); len(checks) == 0 {
		t.Error("got no goal checks; want them checked (not asserted) on every workload")
	}
}
