package retryhttp

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive client-side rate limiting: a budget stops retries, but a client
// that is being throttled also has to slow its first attempts. The AWS SDKs'
// adaptive retry mode does it with a CUBIC-shaped send rate (aws-sdk-go-v2,
// aws/retry/adaptive_ratelimit.go; the shape is CUBIC's, RFC 9438): the
// rate drops to 0.7 of the measured send rate on a throttle and grows back
// along a cubic curve, and a token bucket hands out permits at that rate.
// RateLimiter keeps the shape and changes four things, each measured in
// docs/throttling.md on the same workload:
//
//   - One cut per round: a throttle answering an attempt whose permit was
//     given before the last cut says nothing new (the cut was already made
//     for it). The AWS limiter cuts again for every throttle in a burst,
//     collapsing the rate, and then grows back to the collapsed rate.
//   - A slower recovery: Recovery (12 s) for a rate of 10 per second,
//     scaled by the cube root of the rate as CUBIC's is; the AWS curve is
//     back in about 2 s at that rate, so twenty such clients probe past the
//     server's capacity every few seconds, and each probe costs 429s.
//   - Permits are spaced evenly with no burst (the AWS bucket holds a
//     second's worth), a cut applies at once to attempts already waiting
//     for a permit (they take a new one at the new rate), and a retry takes
//     its permit when its backoff ends, holding no slot while it waits.
//   - At the first throttle, the send rate is measured over what has been
//     sent, even less than a measuring interval's worth; the AWS limiter may
//     then read a rate of zero and start again from its minimum, 0.5/s.

// Defaults of a RateLimiter's zero fields.
const (
	// DefaultLimiterBeta is the share of the send rate kept after a
	// throttle: CUBIC's and the AWS SDKs' 0.7.
	DefaultLimiterBeta = 0.7
	// DefaultLimiterRecovery is how long the rate takes to grow back to
	// where it was cut from, for a rate of 10 per second.
	DefaultLimiterRecovery = 12 * time.Second
	// DefaultLimiterMinRate is the lowest rate, in permits per second: the
	// AWS SDKs' minimum fill rate.
	DefaultLimiterMinRate = 0.5
)

// ErrRateLimited is the error of a request whose next attempt could not get
// a send permit from the Transport's RateLimiter before the request's
// deadline (or within RateLimiter.MaxWait). Nothing was sent for that
// attempt.
var ErrRateLimited = errors.New("retryhttp: no send permit before the deadline")

// A RateLimiter slows a client that is being throttled: every attempt, the
// first of a request included, waits for a send permit, and permits come at
// a rate that drops when a throttling response (429, or what the Policy
// classifies as Throttling) arrives and grows back while none does.
//
// Until its first throttle, a RateLimiter only counts what is sent: it lets
// everything through. On a throttle the rate drops to Beta times the
// current send rate; it then grows back along a cubic curve, fast at first, flat when it nears the rate it was cut from
// (after Recovery, for a rate of 10 per second), and faster again beyond
// it, probing for more. A throttle answering a permit given before the last
// cut cuts nothing more. It never exceeds twice the
// measured send rate, so that a quiet client does not build up a rate it
// could not have tested. A request whose permit would come after its
// deadline fails at once with ErrRateLimited rather than waiting for
// nothing.
//
// The zero RateLimiter is ready to use with the defaults above. It is safe
// for concurrent use, and several Transports may share one, as they may
// share a Budget, when they call the same dependency: a RateLimiter limits
// everything that goes through it, so give each dependency (each host that
// throttles on its own) a RateLimiter of its own. It starts no goroutine and
// no timer of its own; the waits are the requests' own. Its fields must not
// change after its first use.
type RateLimiter struct {
	// Beta is the share of the send rate kept after a throttle, between 0
	// and 1. Zero, or any value outside (0, 1), NaN included, means
	// DefaultLimiterBeta.
	Beta float64
	// Recovery is how long after a throttle the rate is back at the rate
	// it was cut from, when that rate was 10 permits per second; for a
	// rate r it is Recovery times the cube root of r/10. A longer Recovery
	// means fewer 429s and slower probing for capacity (docs/throttling.md
	// measures both). Zero means DefaultLimiterRecovery.
	Recovery time.Duration
	// MinRate is the lowest rate, in permits per second. Zero, a negative
	// value, NaN or infinity means DefaultLimiterMinRate.
	MinRate float64
	// MaxWait bounds an attempt's whole wait for its permit, across any
	// cuts made while it waits: an attempt whose permit would come later
	// fails with ErrRateLimited at once. It applies whether or not the
	// request has a deadline. Zero means no bound but the request's
	// deadline, so a request without one waits as long as it takes (or
	// until its context ends).
	MaxWait time.Duration

	// Until the first throttle (limiting is false), sends are only
	// counted, and the clock is read once every idleRoll sends.
	limiting atomic.Bool
	idleSent atomic.Int64

	mu sync.Mutex
	// Two marks of idleSent and when they were taken, for the send rate at
	// the first throttle.
	mark, prevMark     int64
	markAt, prevMarkAt time.Time

	epoch   uint64    // cuts so far
	seq     uint64    // permits given so far, once limiting
	refused int64     // permits refused
	wmax    float64   // the rate the curve grows back to
	cutAt   time.Time // when it was made
	next    time.Time // when the next permit is due
	// The measured send rate, once limiting: permits counted in
	// intervals of measureInterval, smoothed as the AWS limiter smooths
	// its own.
	interval time.Time
	sent     float64
	measured float64
}

const (
	// idleRoll is how many sends an idle limiter counts between two
	// readings of the clock.
	idleRoll        = 64
	measureInterval = 500 * time.Millisecond
	measureSmooth   = 0.8
	// minMeasure is the shortest span a send rate is measured over, so
	// that the first few sends do not read as a huge rate.
	minMeasure = 100 * time.Millisecond
	// recoveryRate is the rate whose curve takes Recovery to grow back;
	// the time scales with the cube root of the rate, as CUBIC's does.
	recoveryRate = 10.0
)

func (l *RateLimiter) beta() float64 {
	if !(l.Beta > 0 && l.Beta < 1) { // NaN too
		return DefaultLimiterBeta
	}
	return l.Beta
}

func (l *RateLimiter) recovery() time.Duration {
	if l.Recovery <= 0 {
		return DefaultLimiterRecovery
	}
	return l.Recovery
}

func (l *RateLimiter) minRate() float64 {
	if !(l.MinRate > 0) || math.IsInf(l.MinRate, 1) { // NaN too
		return DefaultLimiterMinRate
	}
	return l.MinRate
}

// Rate reports the permits per second the limiter allows now, or 0 while it
// is not limiting (before its first throttle).
func (l *RateLimiter) Rate() float64 { return l.Stats().Rate }

// RateLimiterStats is a RateLimiter's state, for metrics.
type RateLimiterStats struct {
	// Rate is the permits per second allowed now; 0 while not limiting.
	Rate float64
	// Cuts counts the cuts of the rate so far.
	Cuts uint64
	// Refused counts the attempts that got no permit before their
	// deadline (or within MaxWait) and were not made.
	Refused int64
}

// Stats reports the limiter's state.
func (l *RateLimiter) Stats() RateLimiterStats {
	if !l.limiting.Load() {
		return RateLimiterStats{}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return RateLimiterStats{Rate: l.rateAt(time.Now()), Cuts: l.epoch, Refused: l.refused}
}

// rateAt is the allowed rate at now: the cubic curve through Beta*wmax at
// the cut and wmax after Recovery, capped at twice the measured rate and
// floored at MinRate. Must hold mu.
func (l *RateLimiter) rateAt(now time.Time) float64 {
	k := l.recovery().Seconds() * math.Cbrt(l.wmax/recoveryRate)
	x := (now.Sub(l.cutAt).Seconds() - k) / k
	r := l.wmax * (1 + (1-l.beta())*x*x*x)
	if l.measured > 0 {
		r = min(r, 2*l.measured)
	}
	return max(r, l.minRate())
}

// countIdle counts a send of an idle limiter, at now if known; every
// idleRoll sends it marks the count and the time.
func (l *RateLimiter) countIdle(now time.Time) {
	if n := l.idleSent.Add(1); n%idleRoll == 1 {
		if now.IsZero() {
			now = time.Now()
		}
		l.mu.Lock()
		l.prevMark, l.prevMarkAt = l.mark, l.markAt
		l.mark, l.markAt = n-1, now
		l.mu.Unlock()
	}
}

// count records a permit given at now for the measured send rate, once
// limiting. Must hold mu.
func (l *RateLimiter) count(now time.Time) {
	if span := now.Sub(l.interval); span >= measureInterval {
		rate := l.sent / span.Seconds()
		l.measured = measureSmooth*rate + (1-measureSmooth)*l.measured
		l.interval, l.sent = now, 0
	}
	l.sent++
}

// startLimiting ends the idle state at the first throttle. The send rate is
// the higher of two measures: since the last mark (over minMeasure at
// least), and between the two marks. After a long idle spell the older
// measure spans it and reads low; just after a mark the newer one has seen
// few sends; either way the other one reads the recent rate. Must hold mu.
func (l *RateLimiter) startLimiting(now time.Time) {
	var rate float64
	if !l.markAt.IsZero() {
		rate = float64(l.idleSent.Load()-l.mark) / max(now.Sub(l.markAt), minMeasure).Seconds()
	}
	if !l.prevMarkAt.IsZero() {
		rate = max(rate, float64(l.mark-l.prevMark)/max(l.markAt.Sub(l.prevMarkAt), minMeasure).Seconds())
	}
	l.measured = rate
	l.interval, l.sent = now, 0
	l.limiting.Store(true)
}

// A permit is an attempt's right to be sent, from a RateLimiter. It is a
// value owned by the attempt: used once the attempt is sent (a throttling
// answer to it then reaches the limiter through throttled), or canceled when
// the attempt will not be sent, which gives its slot back. The zero permit
// is no permit; an idle limiter's permits hold no slot.
type permit struct {
	l      *RateLimiter
	epoch  uint64        // the cuts made before it was given
	seq    uint64        // the permits given before it
	slot   time.Duration // the interval it took; zero for an idle limiter's
	waited time.Duration // how long the attempt waited for it
}

// acquire waits for a permit for an attempt due now, until it holds one of
// the current rate (a cut during the wait voids the slot taken before it),
// and puts it in into. It returns ErrRateLimited, without waiting for
// nothing, when the permit would come at or after ctx's deadline or more
// than MaxWait after the attempt was due, or the context's error when it
// ends first; either way it holds nothing.
func (l *RateLimiter) acquire(ctx context.Context, into *permit) error {
	if !l.limiting.Load() {
		l.countIdle(time.Time{})
		*into = permit{l: l}
		return nil
	}
	deadline, _ := ctx.Deadline()
	due := time.Now()
	slept := false
	for {
		now := time.Now()
		p, at, ok := l.reserve(due, now, deadline)
		if !ok {
			return ErrRateLimited
		}
		if d := at.Sub(now); d > 0 {
			if err := sleep(ctx, d); err != nil {
				p.cancel()
				return err
			}
			slept = true
			if !l.current(p.epoch) {
				continue // cut while waiting: the slot went with the old rate
			}
		}
		if slept {
			p.waited = time.Since(due)
		}
		*into = p
		return nil
	}
}

// tryAcquire gives a permit for an attempt to be sent at now, only if one is
// due by then: a hedge does not wait for a permit, and does not push the
// request's other attempts back.
func (l *RateLimiter) tryAcquire(now time.Time) (permit, bool) {
	if !l.limiting.Load() {
		l.countIdle(now)
		return permit{l: l}, true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.next.After(now) {
		return permit{}, false
	}
	iv := interval(l.rateAt(now))
	l.next = now.Add(iv)
	l.count(now)
	l.seq++
	return permit{l: l, epoch: l.epoch, seq: l.seq, slot: iv}, true
}

// reserve takes the slot of an attempt due at due, asked at now, and
// reports when it comes. It takes nothing and reports false when the slot
// would come at or after deadline (if not zero) or more than MaxWait after
// due.
func (l *RateLimiter) reserve(due, now, deadline time.Time) (permit, time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := later(l.next, now)
	if !l.permitted(at, due, deadline) {
		l.refused++
		return permit{}, time.Time{}, false
	}
	iv := interval(l.rateAt(at))
	l.next = at.Add(iv)
	l.count(now)
	l.seq++
	return permit{l: l, epoch: l.epoch, seq: l.seq, slot: iv}, at, true
}

// cancel gives back the slot of a permit whose attempt will not be sent, as
// x/time/rate's Reservation.Cancel does: if no permit was given after it,
// the next one comes one interval sooner, never before now. A slot with
// later permits behind it stays taken: giving it back would let the next
// permit come right after the one before it, a burst. A permit of a rate
// since cut holds no slot (the cut voided it), nor does an idle limiter's.
// It empties p.
func (p *permit) cancel() {
	l := p.l
	if l == nil || p.slot == 0 {
		*p = permit{}
		return
	}
	now := time.Now()
	l.mu.Lock()
	if p.epoch == l.epoch && p.seq == l.seq {
		l.next = later(l.next.Add(-p.slot), now)
		if l.sent > 0 {
			l.sent--
		}
	}
	l.mu.Unlock()
	*p = permit{}
}

// throttled reports a throttling answer to the attempt sent under p.
func (p *permit) throttled(now time.Time) {
	if p.l != nil {
		p.l.throttled(p.epoch, now)
	}
}

// permitted reports whether a permit at at, for an attempt due at due, comes
// before deadline (if not zero) and within MaxWait.
func (l *RateLimiter) permitted(at, due, deadline time.Time) bool {
	return (deadline.IsZero() || at.Before(deadline)) && (l.MaxWait <= 0 || at.Sub(due) <= l.MaxWait)
}

// interval is the gap between two permits at rate r per second.
func interval(r float64) time.Duration { return time.Duration(float64(time.Second) / r) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// current reports whether a permit of epoch was given at the current rate:
// no cut has been made since.
func (l *RateLimiter) current(epoch uint64) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return epoch == l.epoch
}

// throttled records a throttling answer to an attempt sent under a permit
// of epoch, at now. It cuts the rate to Beta times the rate the attempt was
// sent at, once per epoch: a throttle answering a permit given before the
// last cut says nothing the cut did not already answer.
func (l *RateLimiter) throttled(epoch uint64, now time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.limiting.Load() {
		l.startLimiting(now)
	}
	if epoch != l.epoch {
		return // sent at a rate already cut since
	}
	w := l.measured
	if l.epoch > 0 {
		w = min(w, l.rateAt(now))
	}
	l.wmax = max(w, l.minRate())
	l.cutAt = now
	l.epoch++
	// The next permit is one interval of the new rate away; attempts
	// already waiting take new permits (see await).
	l.next = now.Add(interval(l.rateAt(now)))
}

// rate is Rate for a Limiter that may be nil.
func (l *RateLimiter) rate() float64 {
	if l == nil {
		return 0
	}
	return l.Rate()
}

// admits reports whether a retry that backoff would send after delay can
// get a permit before the request's deadline (and within MaxWait): if not,
// it is not made, and the response that called for it is returned. It takes
// nothing: the retry takes its permit when it is due (await), so that a
// retry planned far ahead holds no slot that other attempts could use.
func (l *RateLimiter) admits(ctx context.Context, delay time.Duration) bool {
	if !l.limiting.Load() {
		return true
	}
	deadline, _ := ctx.Deadline()
	due := time.Now().Add(delay)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.permitted(later(l.next, due), due, deadline) {
		l.refused++
		return false
	}
	return true
}
