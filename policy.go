package retryhttp

import (
	"math/rand/v2"
	"net/http"
	"time"

	"github.com/herdproof/retryhttp/internal/backoff"
)

// The defaults of a Policy's zero fields. The delays are those of the AWS
// SDKs' standard retry mode.
const (
	defaultMaxAttempts       = 3
	defaultBaseDelay         = 50 * time.Millisecond
	defaultThrottleBaseDelay = time.Second
	defaultMaxDelay          = 20 * time.Second
)

// A Policy says which attempts a Transport makes and how long it waits
// between them. Its zero value is the recommended policy: three attempts,
// full-jitter backoff from 50ms (1s after throttling) capped at 20s, and no
// deadline beyond the request's context. These are the AWS SDKs' standard
// retry mode.
//
// A Policy is a plain value: copy it, change a field, give it to another
// Transport. Its func fields must be safe for concurrent use.
type Policy struct {
	// MaxAttempts is the number of attempts, the first included. Zero or
	// less means 3. 1 disables retries and idempotency keys; deadlines,
	// hooks and logs still apply.
	MaxAttempts int

	// BaseDelay is the first backoff ceiling after a Transient failure.
	// The ceiling doubles with every retry. Zero means 50ms.
	BaseDelay time.Duration

	// ThrottleBaseDelay is the first ceiling after a Throttling failure.
	// Zero means 1s.
	ThrottleBaseDelay time.Duration

	// MaxDelay caps one backoff wait. Zero means 20s.
	MaxDelay time.Duration

	// Jitter chooses how a wait is drawn below its ceiling. The zero value
	// is FullJitter.
	Jitter Jitter

	// MaxServerDelay is the longest wait a server may ask for, with
	// Retry-After, x-amz-retry-after or retry-after-ms. The response to a
	// longer request goes back to the caller at once. Zero means MaxDelay.
	// A negative value ignores server delays and always uses backoff.
	MaxServerDelay time.Duration

	// Timeout limits the whole exchange, like http.Client.Timeout: every
	// attempt, every wait and the reading of the final body. A wait that
	// would not end before it is not started. A 101 Switching Protocols
	// response ends it: the upgraded connection is the caller's. Zero
	// means no limit beyond the request context's deadline.
	Timeout time.Duration

	// AttemptTimeout limits one attempt, up to its response headers. An
	// attempt that runs out fails with ErrAttemptTimeout and is retried as
	// Transient. It never cuts off the body that is returned. Zero means no
	// limit per attempt.
	AttemptTimeout time.Duration

	// AttemptTimeoutQuantile, between 0 and 1, sets AttemptTimeout from
	// the dependency's recent latency (each destination's, with PerHost):
	// the latency within which that share of attempts answered. It is the
	// false-timeout rate chosen: 0.999 lets about one healthy attempt in a
	// thousand time out, and cuts a hung one near the p99.9. AttemptTimeout
	// is its ceiling, and serves until a full window of attempts is
	// measured. An attempt it cuts counts as slower than any measured.
	// When too many are cut, the quantile has moved above it: the timeout
	// doubles, up to AttemptTimeout (docs/design.md gives the rule). An
	// attempt in flight when it rises gets the longer timeout. It
	// shares hedging's measurements. Zero, or an AttemptTimeout of zero,
	// means the fixed AttemptTimeout.
	AttemptTimeoutQuantile float64

	// Classify sorts each attempt's outcome. Exactly one of its arguments
	// is non-nil. It must not consume the body: PeekBody reads a bounded
	// prefix and puts it back. Nil means DefaultClassify.
	Classify func(*http.Response, error) Class

	// Rand returns a uniform random integer in [0, n) for n > 0. It draws
	// the jitter. Nil means math/rand/v2's Int64N. Tests and simulations
	// replace it. A value outside [0, n) is taken as the nearer end.
	Rand func(n int64) int64

	// IdempotencyHeader names the header of a write's idempotency key.
	// Empty means "Idempotency-Key".
	IdempotencyHeader string

	// NewIdempotencyKey makes the key of a POST or PATCH that carries none.
	// It is called once per RoundTrip, and every attempt sends the same
	// key. Nil means a random (version 4) UUID. An empty key is no key: the
	// write is then retried only after a failure that proves it was never
	// sent. A func that returns "" turns keys off.
	NewIdempotencyKey func() string

	// HedgeDelay turns hedging on. When an attempt has had no answer for
	// HedgeDelay, another copy is sent. The first answer that is not a
	// retryable failure wins; the other copies are canceled, drained and
	// closed. Only a request that may be sent twice is hedged: GET, HEAD,
	// OPTIONS, TRACE, PUT or DELETE, with a body only through GetBody. A
	// write is never hedged, even with a key: a server that deduplicates
	// keys answers a copy in progress with 409 Conflict. Each hedge counts
	// against MaxAttempts. Set it near the dependency's 95th percentile, or
	// set HedgeQuantile instead. AttemptTimeout bounds each copy, as it
	// bounds an attempt that is not hedged. A delay at or past
	// AttemptTimeout sends no hedge. Zero means no hedging, unless
	// HedgeQuantile is set. See docs/guide-hedging.md.
	HedgeDelay time.Duration

	// HedgeQuantile, between 0 and 1, turns hedging on with a measured
	// delay: the latency within which that share of recent attempts
	// answered (each destination's, with PerHost). Attempts are not hedged
	// until twenty are measured. HedgeDelay, if set too, is the shortest
	// delay. Zero means the fixed HedgeDelay.
	HedgeQuantile float64

	// HedgeRatio bounds the hedged copies that lose, as a share of the
	// requests that may be hedged. Every such request adds the share,
	// every hedge takes one whole, and a hedge that wins gives it back. A
	// dependency slow for everyone then gets no more than this share in
	// extra copies. A hedge that cannot be sent is asked for again after a
	// quarter of the delay. Hedges are not paid from the Budget. Zero, a
	// negative value, NaN or +Inf means 5%. The share is capped at 10.
	HedgeRatio float64

	// MaxHedges is the most hedged copies of one attempt, each sent a
	// hedge delay after the one before. Zero means 1. More than 100
	// means 100.
	MaxHedges int

	// SendAttemptHeader makes every attempt carry its number, 1 for the
	// first, in a Retry-Attempt header. Servers and their logs can then
	// tell first tries from retries. It costs a copy of the request and its
	// header per attempt.
	SendAttemptHeader bool

	// PropagateDeadline makes every attempt carry the time it has left,
	// in whole milliseconds, in a Request-Timeout-Ms header. It is the
	// sooner of the context's deadline and Timeout, less the time spent,
	// and of the attempt's timeout.
	// Handler makes it the deadline of the request it serves. With it, an
	// attempt that the dependency's measured latency says cannot end in
	// time is not begun, nor a wait before one: the request fails at once
	// with StopDeadline. An attempt with neither a deadline nor a timeout
	// sends no header.
	// False sends none and refuses nothing early. It costs a copy of the
	// request and its header per attempt.
	PropagateDeadline bool
}

// attemptTimeoutQuantile is AttemptTimeoutQuantile, or 0 when it is not a
// quantile or there is no AttemptTimeout to bound it.
func (p *Policy) attemptTimeoutQuantile() float64 {
	if p.AttemptTimeoutQuantile > 0 && p.AttemptTimeoutQuantile < 1 && p.AttemptTimeout > 0 {
		return p.AttemptTimeoutQuantile
	}
	return 0
}

// measures reports whether the Policy keeps latency estimates: for a
// hedge delay, an attempt timeout, or a deadline's fail-fast.
func (p *Policy) measures() bool {
	return p.hedgeQuantile() > 0 || p.attemptTimeoutQuantile() > 0 || p.PropagateDeadline
}

func (p *Policy) maxAttempts() int {
	if p.MaxAttempts <= 0 {
		return defaultMaxAttempts
	}
	return p.MaxAttempts
}

func (p *Policy) baseDelay(c Class) time.Duration {
	if c == Throttling {
		return orDefault(p.ThrottleBaseDelay, defaultThrottleBaseDelay)
	}
	return orDefault(p.BaseDelay, defaultBaseDelay)
}

func (p *Policy) maxDelay() time.Duration { return orDefault(p.MaxDelay, defaultMaxDelay) }

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

// Jitter is the way a backoff wait is drawn below its ceiling. See
// "Exponential Backoff and Jitter" on the AWS Architecture Blog for the
// comparison behind the default.
type Jitter uint8

const (
	// FullJitter waits uniform in [0, min(MaxDelay, base*2^n)]. It spreads
	// a herd of clients the most for the least total wait. The AWS SDKs use
	// it.
	FullJitter Jitter = iota
	// EqualJitter waits t/2 plus uniform in [0, t/2], where t is
	// min(MaxDelay, base*2^n). It never waits less than half the ceiling.
	EqualJitter
	// DecorrelatedJitter waits min(MaxDelay, uniform in [base, 3*previous]).
	// The previous wait is base before the first.
	DecorrelatedJitter
)

// delay returns the wait before retry n (0 for the first retry).
// A value past DecorrelatedJitter is read as FullJitter.
func (j Jitter) delay(n int, base, limit, prev time.Duration, rnd func(int64) int64) time.Duration {
	if j > DecorrelatedJitter {
		j = FullJitter
	}
	return backoff.Jitter(j).Delay(n, base, limit, prev, rnd)
}

// uniform returns a uniform duration in [0, d], both ends included.
func uniform(rnd func(int64) int64, d time.Duration) time.Duration { return backoff.Uniform(rnd, d) }
