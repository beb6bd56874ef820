package retryhttp

import (
	"math"
	"time"
)

// Helpers for the tests of other parts (hedging, the Transport) that need a
// limiter already limiting. The limiter's own tests use only its exported
// API (ratelimit_test.go).

// seventh is the interval of 7 permits a second: a limiter's first 429,
// answering its only attempt (1 in the meters' shortest span, a tenth of a
// second: 10/s), cuts it to limBeta of that.
var seventh = time.Second * 1e6 / 7e6

// holdAt sets l limiting at rate permits a second from now for d, a permit
// due now, as if a cut had set it there.
func holdAt(l *RateLimiter, rate float64, d time.Duration) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.limited, l.top, l.low = true, rate, rate
	l.scale, l.plateau = math.SmallestNonzeroFloat64, d.Seconds()
	l.cutAt, l.next = now, now
	l.cuts++
}
