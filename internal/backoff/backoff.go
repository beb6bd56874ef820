// Package backoff draws the Transport's backoff waits. The herd model
// (internal/herd) and its plots draw the very same schedules from here, so
// that the library's claims about jitter are shown with its own code.
package backoff

import (
	"math"
	"math/rand/v2"
	"strconv"
	"time"
)

// Jitter is the way a backoff wait is drawn. See "Exponential Backoff and
// Jitter" on the AWS Architecture Blog for the comparison. Its values
// match retryhttp.Jitter's, with None added for comparison.
type Jitter uint8

const (
	// Full waits uniform in [0, min(limit, base*2^n)]. It spreads a herd
	// of clients the most for the least total wait.
	Full Jitter = iota
	// Equal waits t/2 plus uniform in [0, t/2], t = min(limit, base*2^n).
	Equal
	// Decorrelated waits min(limit, uniform in [base, 3*previous]).
	Decorrelated
	// None waits exactly min(limit, base*2^n). Clients that failed
	// together come back together.
	None
)

func (j Jitter) String() string {
	switch j {
	case Full:
		return "full"
	case Equal:
		return "equal"
	case Decorrelated:
		return "decorrelated"
	case None:
		return "none"
	}
	return "jitter(" + strconv.Itoa(int(j)) + ")"
}

// Delay returns the wait before retry n (0 for the first retry), with the
// given base and limit. prev is the previous wait, read by Decorrelated
// only; zero or less means base. rnd returns a uniform integer in [0, k)
// for k > 0; nil means math/rand/v2's Int64N. A value outside [0, k) is
// taken as the nearer end. The result lies in [0, limit] for any n.
func (j Jitter) Delay(n int, base, limit, prev time.Duration, rnd func(int64) int64) time.Duration {
	if base <= 0 || limit <= 0 {
		return 0
	}
	if rnd == nil {
		rnd = rand.Int64N
	}
	switch j {
	case Decorrelated:
		if prev <= 0 {
			prev = base
		}
		hi := limit
		if prev <= math.MaxInt64/3 {
			hi = min(3*prev, limit)
		}
		if hi <= base {
			return min(base, limit)
		}
		return base + Uniform(rnd, hi-base)
	case Equal:
		t := ceiling(n, base, limit)
		half := t / 2
		return half + Uniform(rnd, t-half)
	case None:
		return ceiling(n, base, limit)
	default:
		return Uniform(rnd, ceiling(n, base, limit))
	}
}

// ceiling returns min(limit, base*2^n) without overflowing.
func ceiling(n int, base, limit time.Duration) time.Duration {
	if n < 0 {
		n = 0
	}
	if n >= 63 || base > limit>>uint(n) {
		return limit
	}
	return min(base<<uint(n), limit)
}

// Uniform returns a uniform duration in [0, d], both ends included, from
// rnd. A value of rnd outside [0, k) is taken as the nearer end.
func Uniform(rnd func(int64) int64, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	var v int64
	if d == math.MaxInt64 {
		v = rnd(int64(d))
	} else {
		v = rnd(int64(d) + 1)
	}
	return time.Duration(min(max(v, 0), int64(d)))
}
