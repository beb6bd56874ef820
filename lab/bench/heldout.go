package bench

import "time"

// HeldOutWorkloads are workloads of six kinds the matrix does not hold
// (issue 33's table), run to check that the limiter's goals hold beyond the
// workloads it was measured on: capacity flapping every 5 s, a capacity
// that rises without falling first, a demand that swings, many tiny
// clients, unequal clients far over the capacity, and 429s with
// Retry-After: 1. The limiter was not tuned on them (cmd/matrix -heldout;
// lab/runs/throttling-heldout.json).
func HeldOutWorkloads() []Workload {
	ms, s := time.Millisecond, time.Second
	flap := []Step{{0, 300}, {5 * s, 100}, {10 * s, 300}, {15 * s, 100}, {20 * s, 300}, {25 * s, 100}}
	return []Workload{
		{Name: "flapping300-100/30c/450/5ms/1s", Capacity: flap, Service: 5 * ms, Deadline: s,
			Rates: EqualRates(30, 450), Duration: 30 * s},
		{Name: "rise100-400/10c/350/5ms/1s", Capacity: []Step{{0, 100}, {10 * s, 400}}, Service: 5 * ms, Deadline: s,
			Rates: EqualRates(10, 350), Duration: 30 * s},
		{Name: "swing150-900-150/20u/300cap/5ms/2s", Capacity: steady(300), Service: 5 * ms, Deadline: 2 * s,
			Rates: SpreadRates(20, 150, 5), Demand: []Step{{0, 1}, {10 * s, 6}, {20 * s, 1}}, Duration: 30 * s},
		{Name: "tiny/200c/2each/200cap/5ms/1s", Capacity: steady(200), Service: 5 * ms, Deadline: s,
			Rates: EqualRates(200, 400), Duration: 30 * s},
		{Name: "unequal/30u/5x/5ms/2s", Capacity: steady(100), Service: 5 * ms, Deadline: 2 * s,
			Rates: SpreadRates(30, 500, 10), Duration: 30 * s},
		{Name: "retryafter1/20u/3x/200cap/5ms/2s/ra", Capacity: steady(200), Service: 5 * ms, Deadline: 2 * s,
			Rates: SpreadRates(20, 600, 10), RetryAfter: s, Duration: 30 * s},
	}
}
