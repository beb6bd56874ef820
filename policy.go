package retryhttp

import (
	"math"
	"math/rand/v2"
	"net/http"
	"time"
)

// Defaults used where a Policy field is zero. The delays are those of the AWS
// SDKs' standard retry mode.
const (
	DefaultMaxAttempts       = 3
	DefaultBaseDelay         = 50 * time.Millisecond
	DefaultThrottleBaseDelay = time.Second
	DefaultMaxDelay          = 20 * time.Second
)

// A Policy says which attempts a Transport makes and how long it waits
// between them. Its zero value is the recommended policy: three attempts,
// full-jitter backoff from 50ms (1s after throttling) capped at 20s, and no
// deadline beyond the request's context.
//
// A Policy is a plain value: copy it, change a field, give it to another
// Transport. Func fields must be safe for concurrent use when the Transport
// is shared.
type Policy struct {
	// MaxAttempts is the number of attempts, the first one included: 3 means
	// one call and at most two retries. Zero or less means 3; 1 disables
	// retries (and idempotency keys), while deadlines, hooks and logs still
	// apply.
	MaxAttempts int

	// BaseDelay is the first backoff ceiling after a Transient failure; the
	// ceiling doubles with every retry. Zero means 50ms.
	BaseDelay time.Duration

	// ThrottleBaseDelay is the same after a Throttling failure (429). Zero
	// means 1s.
	ThrottleBaseDelay time.Duration

	// MaxDelay caps one backoff wait. Zero means 20s.
	MaxDelay time.Duration

	// Jitter chooses how a wait is drawn below its ceiling. The zero value
	// is FullJitter.
	Jitter Jitter

	// MaxServerDelay is the longest wait a server may ask for with
	// Retry-After, x-amz-retry-after or retry-after-ms. A longer request is
	// not waited for: the response goes back to the caller at once. Zero
	// means MaxDelay; a negative value ignores server-requested delays and
	// always uses backoff.
	MaxServerDelay time.Duration

	// Timeout limits the whole exchange: every attempt, every wait and the
	// reading of the final response body, like http.Client.Timeout. A wait
	// that would not end before it is not started. A 101 Switching
	// Protocols response ends it: the upgraded connection belongs to the
	// caller, who closes it. Zero means no limit beyond the request
	// context's deadline.
	Timeout time.Duration

	// AttemptTimeout limits one attempt, up to the arrival of the response
	// headers; an attempt that runs out fails with ErrAttemptTimeout and is
	// retried as Transient. It never cuts off the reading of the response
	// body that is returned. Zero means no per-attempt limit.
	AttemptTimeout time.Duration

	// Classify sorts each attempt's outcome; exactly one of its arguments is
	// non-nil. It must not consume the response body: to look inside one,
	// use PeekBody, which reads a bounded prefix and puts it back. Nil means
	// DefaultClassify.
	Classify func(*http.Response, error) Class

	// Rand returns a uniform random integer in [0, n) for n > 0; it draws
	// the jitter. Nil means math/rand/v2's Int64N. Replace it for
	// deterministic tests and simulations; it must be safe for concurrent
	// use if the Transport is shared. A value outside [0, n) is taken as
	// the nearer end, so that no wait is negative or past its window.
	Rand func(n int64) int64

	// IdempotencyHeader names the header that carries the idempotency key of
	// a POST or PATCH. Empty means "Idempotency-Key".
	IdempotencyHeader string

	// NewIdempotencyKey makes the key of a POST or PATCH that does not carry
	// one; it is called once per RoundTrip, and every attempt sends the
	// same key. Nil means a random (version 4) UUID in its 36-character
	// form, e.g. "3f1c56a4-8c2e-4c4b-9a57-2b1e7b0d2f61". An empty key is no
	// key: the write is sent once, unkeyed, neither retried nor hedged.
	NewIdempotencyKey func() string

	// HedgeDelay turns hedging on: when an attempt of a request that may be
	// sent twice (GET, HEAD, OPTIONS, TRACE, PUT or DELETE; not a write,
	// even with an idempotency key: a server that deduplicates keys answers
	// a copy sent while another is in progress with 409 Conflict; a body
	// only through GetBody) has had no answer for HedgeDelay, another copy
	// is sent, and
	// the first answer that is not a retryable failure wins; the other
	// copies are canceled, drained and closed. Hedges are limited to
	// HedgeRatio of the requests; one that cannot be sent yet is asked for
	// again after a quarter of the delay, and the first ask leaves nearly
	// a hedge for those asked again (1 - HedgeRatio of one, when that is
	// positive), so that a short share goes to the slowest copies. Each
	// hedge counts as an attempt against MaxAttempts and is reported in
	// Attempt.Hedges. Set it near the dependency's 95th percentile latency,
	// or set HedgeQuantile instead.
	// AttemptTimeout bounds each copy, as it bounds an attempt that is not
	// hedged; a delay at or past it sends no hedge. Zero means no hedging,
	// unless HedgeQuantile is set. See docs/guide-hedging.md.
	HedgeDelay time.Duration

	// HedgeQuantile, between 0 and 1 (0.95 for the 95th percentile), turns
	// hedging on with a delay measured rather than set: the latency within
	// which that share of the Transport's recent attempts answered (each
	// destination's, with PerHost), over the last five hundred to a
	// thousand. Attempts are not hedged until twenty are measured (one
	// ended by AttemptTimeout, or beaten by its hedge, counts as the time
	// it ran: at least that long), and the first estimates, from few
	// attempts, err late. HedgeDelay, if set
	// too, is the shortest delay. Zero means the fixed HedgeDelay.
	HedgeQuantile float64

	// HedgeRatio is the most hedged copies that lose, as a share of the
	// requests that may be hedged: every such request adds the share, every
	// hedge takes one whole, starting from none, and a hedge that wins gives
	// its whole back, so that a dependency slow for everyone gets no more
	// than this share in extra copies. Hedges are not paid from the Budget.
	// Zero, a negative value, NaN or +Inf means DefaultHedgeRatio, 5%; a
	// share above 10 means 10 (a hedge quota holds at most 10 hedges), and
	// one below 1e-12 means 1e-12.
	HedgeRatio float64

	// MaxHedges is the most hedged copies of one attempt, each sent
	// a hedge delay after the previous one. Zero means 1; more than 100
	// means 100.
	MaxHedges int

	// SendAttemptHeader makes every attempt carry its number, 1 for the
	// first, in AttemptHeader ("Retry-Attempt: 2"), so that servers and
	// their logs can tell first tries from retries (RequestAttempt reads
	// it). Off by default: it costs a copy of the request and its header per
	// attempt.
	SendAttemptHeader bool

	// NoIdempotencyKeys turns key generation off. A POST or PATCH is then
	// retried only if the caller set the key header itself, or after a
	// failure that proves the request was never sent (the connection could
	// not be made).
	NoIdempotencyKeys bool
}

func (p *Policy) maxAttempts() int {
	if p.MaxAttempts <= 0 {
		return DefaultMaxAttempts
	}
	return p.MaxAttempts
}

func (p *Policy) baseDelay(c Class) time.Duration {
	if c == Throttling {
		return orDefault(p.ThrottleBaseDelay, DefaultThrottleBaseDelay)
	}
	return orDefault(p.BaseDelay, DefaultBaseDelay)
}

func (p *Policy) maxDelay() time.Duration { return orDefault(p.MaxDelay, DefaultMaxDelay) }

func (p *Policy) maxServerDelay() time.Duration {
	if p.MaxServerDelay == 0 {
		return p.maxDelay()
	}
	return p.MaxServerDelay
}

func (p *Policy) classify(resp *http.Response, err error) Class {
	switch {
	case p.Classify != nil:
		return p.Classify(resp, err)
	case err == nil && resp != nil:
		return statusClass(resp.StatusCode) // DefaultClassify's, without the call
	}
	return DefaultClassify(resp, err)
}

func (p *Policy) rand() func(int64) int64 {
	if p.Rand != nil {
		return p.Rand
	}
	return rand.Int64N
}

func orDefault(d, def time.Duration) time.Duration {
	if d <= 0 {
		return def
	}
	return d
}

// Jitter is the way a backoff wait is drawn. See "Exponential Backoff and
// Jitter" on the AWS Architecture Blog for the comparison behind the
// default.
type Jitter uint8

const (
	// FullJitter waits uniform in [0, min(max, base*2^n)]. It spreads a herd
	// of clients the most for the least total wait, and is what the AWS
	// SDKs use.
	FullJitter Jitter = iota
	// EqualJitter waits t/2 plus uniform in [0, t/2], t = min(max, base*2^n):
	// never less than half the ceiling.
	EqualJitter
	// DecorrelatedJitter waits min(max, uniform in [base, 3*previous]),
	// previous being the last wait (base before the first).
	DecorrelatedJitter
	// NoJitter waits exactly min(max, base*2^n). Clients that failed
	// together come back together; it exists for comparison.
	NoJitter
)

func (j Jitter) String() string {
	switch j {
	case FullJitter:
		return "full"
	case EqualJitter:
		return "equal"
	case DecorrelatedJitter:
		return "decorrelated"
	case NoJitter:
		return "none"
	}
	return "jitter(" + itoa(int(j)) + ")"
}

// Delay returns the wait before retry n (0 for the first retry) under this
// schedule, with the given base and limit (the cap). prev is the previous wait, used only
// by DecorrelatedJitter (zero or less means base). rnd returns a uniform
// integer in [0, k) for k > 0; nil means math/rand/v2's Int64N.
//
// The Transport calls Delay for every backoff wait; it is exported so that
// simulations can drive the very same schedule. The result lies in [0, limit]
// for any n, with no overflow.
func (j Jitter) Delay(n int, base, limit, prev time.Duration, rnd func(int64) int64) time.Duration {
	if base <= 0 || limit <= 0 {
		return 0
	}
	if rnd == nil {
		rnd = rand.Int64N
	}
	switch j {
	case DecorrelatedJitter:
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
		return base + uniform(rnd, hi-base)
	case EqualJitter:
		t := ceiling(n, base, limit)
		half := t / 2
		return half + uniform(rnd, t-half)
	case NoJitter:
		return ceiling(n, base, limit)
	default:
		return uniform(rnd, ceiling(n, base, limit))
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

// uniform returns a uniform duration in [0, d], both ends included.
func uniform(rnd func(int64) int64, d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	var v int64
	if d == math.MaxInt64 {
		v = rnd(int64(d))
	} else {
		v = rnd(int64(d) + 1)
	}
	return time.Duration(min(max(v, 0), int64(d))) // a Rand outside [0, n) is clamped
}
