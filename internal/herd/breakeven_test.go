package herd

import (
	"math"
	"testing"
	"testing/synctest"

	"github.com/herdproof/retryhttp"
)

func TestBreakEven(t *testing.T) {
	for _, c := range []struct {
		cost int
		want float64 // p* to 4 places
	}{{14, 0.2149}, {5, 0.3207}} { // checked by hand: E(0.2149) = +0.0003, E(0.2150) = -0.0001
		p := BreakEven(c.cost)
		if math.Abs(p-c.want) > 5e-5 {
			t.Errorf("cost %d: got p* = %.5f; want %.4f", c.cost, p, c.want)
		}
		if d := Drift(p, c.cost); math.Abs(d) > 1e-9 {
			t.Errorf("cost %d: drift at p* is %g; want 0", c.cost, d)
		}
	}
}

// TestQuotaAroundBreakEven drives the real Transport and Budget for 100,000
// requests per point, in fake time: well below p* no retry is refused; above
// it, the refused share grows with p.
func TestQuotaAroundBreakEven(t *testing.T) {
	const requests = 100_000
	for _, kind := range []struct {
		name   string
		status int
		cost   int
	}{{"transient", 503, 14}, {"throttling", 429, 5}} {
		t.Run(kind.name, func(t *testing.T) {
			pStar := BreakEven(kind.cost)
			// -0.01: just below p*, the walk can still touch empty now and then.
			offsets := []float64{-0.05, -0.01, 0.02, 0.05, 0.10}
			var shares []float64
			for i, off := range offsets {
				var q QuotaPoint
				synctest.Test(t, func(t *testing.T) {
					q = DriveQuota(retryhttp.Policy{}, pStar+off, kind.status, requests, uint64(i+1))
				})
				t.Logf("p = p*%+.2f = %.4f: %d retries, %d refused (%.2f%%), fewest tokens %d",
					off, q.P, q.Retries, q.Refused, 100*q.RefusedShare(), q.MinLeft)
				if off <= -0.05 && q.Refused != 0 {
					t.Errorf("p = p*%+.2f: got %d refused retries; want 0", off, q.Refused)
				}
				shares = append(shares, q.RefusedShare())
			}
			for i := 3; i < len(shares); i++ {
				if shares[i] <= shares[i-1] {
					t.Errorf("refused share fell from %.4f to %.4f as p rose; want it to grow", shares[i-1], shares[i])
				}
			}
			if shares[2] == 0 {
				t.Errorf("p = p*+0.02: no retry refused; want the bucket to drain")
			}
		})
	}
}

func TestQuotaWaitsChangeNothing(t *testing.T) {
	var withWaits QuotaPoint
	synctest.Test(t, func(t *testing.T) {
		withWaits = DriveQuota(retryhttp.Policy{}, 0.3, 503, 5000, 7)
	})
	noWaits := DriveQuota(retryhttp.Policy{Rand: func(int64) int64 { return 0 }}, 0.3, 503, 5000, 7)
	if withWaits != noWaits {
		t.Errorf("got %+v with waits and %+v without; want the same", withWaits, noWaits)
	}
}
