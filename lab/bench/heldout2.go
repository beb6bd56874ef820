package bench

import (
	"math"
	"time"
)

// HeldOutWorkloads2 are workloads of six more kinds that neither the matrix
// nor HeldOutWorkloads holds, designed after the limiter was frozen and
// never tuned on: a capacity that drifts along a sine, bursts of demand
// with nothing between them, a slow decline of the capacity, answers that
// take 200 ms through a fall and a return, Retry-After: 5 on every 429,
// and twenty light clients joining one heavy client late (cmd/matrix
// -heldout2; lab/runs/throttling-heldout2.json).
func HeldOutWorkloads2() []Workload {
	ms, s := time.Millisecond, time.Second
	// Twenty light clients join one heavy one at 15 s.
	late := append([]float64{300}, EqualRates(20, 200)...)
	starts := make([]time.Duration, len(late))
	for i := 1; i < len(starts); i++ {
		starts[i] = 15 * s
	}
	return []Workload{
		{Name: "sine100-300/20s/20c/400/5ms/1s", Capacity: sine(100, 300, 20*s, s, 40*s), Service: 5 * ms, Deadline: s,
			Rates: EqualRates(20, 400), Duration: 40 * s},
		{Name: "bursts1s-5x/4s-off/20c/200cap/5ms/1s", Capacity: steady(200), Service: 5 * ms, Deadline: s,
			Rates: EqualRates(20, 200), Demand: onOff(5, s, 4*s, 30*s), Duration: 30 * s},
		{Name: "decline300-100/30s/20u/400/5ms/2s", Capacity: ramp(300, 100, 30*s, s), Service: 5 * ms, Deadline: 2 * s,
			Rates: SpreadRates(20, 400, 10), Duration: 45 * s},
		{Name: "latency200ms/200-50-200/20c/2x/1s", Capacity: []Step{{0, 200}, {10 * s, 50}, {20 * s, 200}},
			Service: 200 * ms, Deadline: s, Rates: EqualRates(20, 400), Duration: 30 * s},
		{Name: "retryafter5/10c/3x/100cap/5ms/2s/ra5", Capacity: steady(100), Service: 5 * ms, Deadline: 2 * s,
			Rates: EqualRates(10, 300), RetryAfter: 5 * s, Duration: 30 * s},
		{Name: "latejoin/1x300+20x10@15s/200cap/5ms/1s", Capacity: steady(200), Service: 5 * ms, Deadline: s,
			Rates: late, Starts: starts, Duration: 40 * s},
	}
}

// sine is a capacity that drifts between lo and hi along a sine of the
// given period, starting half-way and rising, in steps of step up to d:
// each step holds the sine's value at its middle.
func sine(lo, hi float64, period, step, d time.Duration) []Step {
	var steps []Step
	for at := time.Duration(0); at < d; at += step {
		phase := 2 * math.Pi * float64(at+step/2) / float64(period)
		steps = append(steps, Step{at, math.Round((lo + hi + (hi-lo)*math.Sin(phase)) / 2)})
	}
	return steps
}

// onOff is a demand of bursts: factor for on, then nothing for off, again
// and again up to d.
func onOff(factor float64, on, off, d time.Duration) []Step {
	var steps []Step
	for at := time.Duration(0); at < d; at += on + off {
		steps = append(steps, Step{at, factor}, Step{at + on, 0})
	}
	return steps
}

// ramp is a capacity that goes from one rate to another in steps of step
// over the time over, then stays.
func ramp(from, to float64, over, step time.Duration) []Step {
	n := int(over / step)
	steps := make([]Step, 0, n+1)
	for i := 0; i <= n; i++ {
		steps = append(steps, Step{time.Duration(i) * step, math.Round(from + (to-from)*float64(i)/float64(n))})
	}
	return steps
}
