package backoff

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"
)

// lowRand and highRand draw the two ends of every window.
func lowRand(int64) int64    { return 0 }
func highRand(n int64) int64 { return n - 1 }

func TestDelayWindows(t *testing.T) {
	const base, limit = 50 * time.Millisecond, 20 * time.Second
	tests := []struct {
		jitter   Jitter
		n        int
		prev     time.Duration
		low, hi  time.Duration // the window's ends, both reachable
		wantName string
	}{
		{Full, 0, 0, 0, 50 * time.Millisecond, "full"},
		{Full, 3, 0, 0, 400 * time.Millisecond, "full"},
		{Full, 9, 0, 0, limit, "full"}, // 50ms*512 = 25.6s, capped
		{Equal, 0, 0, 25 * time.Millisecond, 50 * time.Millisecond, "equal"},
		{Equal, 2, 0, 100 * time.Millisecond, 200 * time.Millisecond, "equal"},
		{Decorrelated, 0, 0, base, 150 * time.Millisecond, "decorrelated"},
		{Decorrelated, 5, time.Second, base, 3 * time.Second, "decorrelated"},
		{Decorrelated, 5, 10 * time.Second, base, limit, "decorrelated"},
		{None, 0, 0, 50 * time.Millisecond, 50 * time.Millisecond, "none"},
		{None, 4, 0, 800 * time.Millisecond, 800 * time.Millisecond, "none"},
	}
	for _, tc := range tests {
		t.Run(tc.jitter.String()+"/n="+strconv.Itoa(tc.n), func(t *testing.T) {
			if tc.jitter.String() != tc.wantName {
				t.Errorf("got name %q; want %q", tc.jitter.String(), tc.wantName)
			}
			if got := tc.jitter.Delay(tc.n, base, limit, tc.prev, lowRand); got != tc.low {
				t.Errorf("got low end %v; want %v", got, tc.low)
			}
			if got := tc.jitter.Delay(tc.n, base, limit, tc.prev, highRand); got != tc.hi {
				t.Errorf("got high end %v; want %v", got, tc.hi)
			}
			r := rand.New(rand.NewPCG(1, uint64(tc.n)))
			for range 1000 {
				if got := tc.jitter.Delay(tc.n, base, limit, tc.prev, r.Int64N); got < tc.low || got > tc.hi {
					t.Fatalf("got %v; want within [%v, %v]", got, tc.low, tc.hi)
				}
			}
		})
	}
}

func TestDelayNeverOverflows(t *testing.T) {
	for _, j := range []Jitter{Full, Equal, Decorrelated, None} {
		for _, n := range []int{-1, 0, 30, 62, 63, 64, 1000, math.MaxInt} {
			for _, limit := range []time.Duration{time.Second, math.MaxInt64} {
				got := j.Delay(n, time.Hour, limit, math.MaxInt64, highRand)
				if got < 0 || got > limit {
					t.Errorf("%v n=%d limit=%v: got %v; want within [0, limit]", j, n, limit, got)
				}
			}
		}
	}
}

func TestFullIsUniform(t *testing.T) {
	// 100,000 draws into 10 bins of [0, 1s]: each bin within 5% of 10,000.
	r := rand.New(rand.NewPCG(7, 7))
	var bins [10]int
	for range 100_000 {
		d := Full.Delay(0, time.Second, time.Minute, 0, r.Int64N)
		bins[min(int(d*10/time.Second), 9)]++
	}
	for i, c := range bins {
		if c < 9500 || c > 10500 {
			t.Errorf("bin %d: got %d draws; want 10,000 ± 500", i, c)
		}
	}
}
