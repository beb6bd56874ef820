package retryhttp

import (
	"context"
	"errors"
	"math"
	"net/http"
	"sync"
	"time"
)

// ErrRateLimited is the error of a request whose next attempt got no send
// permit in time (see RateLimiter). Nothing was sent for that attempt.
var ErrRateLimited = errors.New("retryhttp: no send permit before the deadline")

// The limiter's tuned numbers, each earned by an ablation on the matrix
// (docs/throttling.md, "Ablation"). They are variables only so that the lab
// can switch one off (ablate.go, built with the tag retryhttp_ablate).
var (
	limBeta    = 0.5  // the least of a rate one cut keeps
	limMargin  = 0.1  // how far below the accepted rate a cut sets the rate
	limTau     = 1.0  // seconds: the time constant of the meters
	limGrowth  = 0.05 // the cubic's scale per second cubed, as a share of the demand
	limWait    = 0.1  // the share of the time left that an attempt may wait
	limCap     = 2.0  // the rate is at most this many times the demand
	limMinRate = 0.1  // permits per second: the lowest rate
	limHold    = 4.0  // seconds: the longest hold at a cut's rate
)

// A RateLimiter paces the attempts of a client that a server throttles.
// Until its first throttle it is free: every attempt goes at once, and it
// meters the attempts asked for (the demand) and those sent. A throttle (a
// 429, or what the Policy classifies as Throttling) cuts the rate once a
// round: a throttle of a permit given before the last cut was answered by
// that cut. The first cut keeps limBeta squared of the rate sent, as the
// capacity is unknown. A later cut keeps the share of the round's answers
// that the server accepted, less limMargin, and at least limBeta. A cut of a
// round that had limBeta of its answers accepted holds its rate twice as
// long as the last did, up to limHold; after a worse round, a fall of the
// capacity, it holds it not at all.
// After the hold the rate grows along a cubic, as CUBIC's window does:
// concave back to the rate that drew the throttle (recovering), then convex
// past it (probing). The cubic's scale is limGrowth of the demand, so that
// clients grow in proportion to what they ask. The rate is never more than
// limCap times the demand (or the cut's rate), nor less than limMinRate.
// Permits are spaced one interval of the rate apart, a slot left unused for
// up to an interval is kept for the next attempt, and a cut starts a new
// schedule: attempts waiting under the last ask again. An attempt waits only
// within limWait of the time left before its deadline, and within MaxWait:
// no queue stands, and the rest fail at once with ErrRateLimited. A refused
// attempt sends nothing and holds no slot; a canceled permit gives its slot
// back, whatever the order of cancels. A throttle with Retry-After (or
// x-amz-retry-after) pauses the limiter: paused, it gives no permit before
// the time the server asked for.
//
// The zero RateLimiter is ready to use. It is safe for concurrent use, and
// Transports that call one dependency may share it; it starts no goroutine
// and no timer. MaxWait must not change after first use.
type RateLimiter struct {
	// MaxWait bounds an attempt's wait for its permit; zero means no bound
	// but the deadline's.
	MaxWait time.Duration

	mu               sync.Mutex
	limited          bool    // a throttle came: not Free
	demand, sent     meter   // attempts asked for, and sent, per second
	answers, accepts int     // answers to the permits of this round, and those accepted
	top, low         float64 // the rate that drew the last throttle, and the cut's
	hold             float64 // seconds the cut's rate is held before the cubic
	scale, plateau   float64 // the cubic's scale, and seconds from the cubic's start to top
	cutAt, next      time.Time
	pause            time.Time // no permit before (Retry-After)
	cuts             uint64
	refused          int64
}

// The states of a RateLimiter (RateLimiterStats.State).
type limiterState uint8

const (
	free       limiterState = iota // no throttle yet: no limit
	recovering                     // below the rate that drew the last throttle
	probing                        // at or past it
	paused                         // within a Retry-After
)

var stateNames = [...]string{"free", "recovering", "probing", "paused"}

// RateLimiterStats is a RateLimiter's state, for metrics.
type RateLimiterStats struct {
	State   string  // "free", "recovering", "probing" or "paused"
	Rate    float64 // permits per second now; 0 while free
	Cuts    uint64  // cuts of the rate so far
	Refused int64   // attempts refused a permit (ErrRateLimited)
}

// Stats reports the limiter's state.
func (l *RateLimiter) Stats() RateLimiterStats {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	s := RateLimiterStats{State: stateNames[l.state(now)], Cuts: l.cuts, Refused: l.refused}
	if l.limited {
		s.Rate = l.rateAt(now)
	}
	return s
}

// state is the limiter's state at now. Must hold mu.
func (l *RateLimiter) state(now time.Time) limiterState {
	switch {
	case !l.limited:
		return free
	case now.Before(l.pause):
		return paused
	case now.Sub(l.cutAt).Seconds() < l.hold+l.plateau:
		return recovering
	}
	return probing
}

// rateAt is the cubic at now, within limCap of the demand and limMinRate.
// Must hold mu.
func (l *RateLimiter) rateAt(now time.Time) float64 {
	t := now.Sub(l.cutAt).Seconds() - l.hold
	r := l.low
	if t > 0 {
		t -= l.plateau
		r = l.top + l.scale*t*t*t
	}
	r = min(r, limCap*max(l.demand.rate(now), l.low))
	return max(r, limMinRate)
}

// cut answers a throttle at now of a permit given at rate drew. Must hold mu.
func (l *RateLimiter) cut(now time.Time, drew float64) {
	top := max(drew, limMinRate)
	kept := float64(l.accepts) / float64(l.answers)
	low := top * max(limBeta, kept*(1-limMargin))
	if !l.limited {
		low = top * limBeta * limBeta // the first: the capacity is unknown
	}
	// A round that had less than limBeta accepted: the capacity fell, and
	// the new rate is not held. Any other finds the capacity where it was,
	// and holds twice as long as the last.
	if l.limited && kept >= limBeta {
		l.hold = min(2*l.hold+l.plateau, limHold)
	} else {
		l.hold = 0
	}
	l.top, l.low = top, low
	l.scale = limGrowth * max(l.demand.rate(now), l.low)
	l.plateau = math.Cbrt((l.top - l.low) / l.scale)
	l.cutAt, l.limited = now, true
	l.answers, l.accepts = 0, 0
	l.next = now.Add(interval(l.low)) // a new schedule: the permits of the last are void
	l.cuts++
}

// A permit is an attempt's right to be sent. It is owned by the attempt:
// answered once the attempt is sent, or canceled, which gives its slot back.
// A free limiter's permit holds no slot.
type permit struct {
	l      *RateLimiter
	cuts   uint64        // the cuts made before it was given: its round
	slot   time.Duration // the interval it took
	at     time.Time     // when its attempt may be sent
	waited time.Duration // how long the attempt waited for it
}

// acquire waits for a permit for an attempt due now and puts it in into. It
// returns ErrRateLimited at once when the permit would come too late, or
// the context's error if it ends first; either way it holds nothing. A cut
// or a pause during the wait voids the permit, and a new one is asked for.
// With need > 0, a permit after which an attempt of need would not end
// before the context's deadline is given back, and errTooLate returned.
func (l *RateLimiter) acquire(ctx context.Context, into *permit, need time.Duration) error {
	due := time.Now()
	deadline, hasDeadline := ctx.Deadline()
	for ask := true; ; ask = false {
		now := time.Now()
		p, ok := l.reserve(now, due, l.longest(ctx, due), ask)
		if !ok {
			return ErrRateLimited
		}
		if need > 0 && hasDeadline && p.at.After(now) && !p.at.Add(need).Before(deadline) {
			p.cancel()
			return errTooLate
		}
		if d := p.at.Sub(now); d > 0 {
			if err := sleep(ctx, d); err != nil {
				p.cancel()
				return err
			}
			l.mu.Lock()
			void := p.cuts != l.cuts || p.at.Before(l.pause) // a new schedule, or a pause
			l.mu.Unlock()
			if void {
				p.cancel()
				continue
			}
			p.waited = time.Since(due)
		}
		*into = p
		return nil
	}
}

// permitWait is how long an attempt sent after delay would wait for its
// permit, by the schedule as it is now: 0 for a nil or free limiter.
func (l *RateLimiter) permitWait(delay time.Duration) time.Duration {
	if l == nil {
		return 0
	}
	due := time.Now().Add(delay)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.limited {
		return 0
	}
	return max(l.due(due).Sub(due), 0)
}

// tryAcquire gives a permit due now, if any: a hedge does not wait.
func (l *RateLimiter) tryAcquire(now time.Time) (permit, bool) {
	return l.reserve(now, now, 0, false)
}

// admits reports whether a retry sent after delay would get a permit in
// time. It takes nothing: the retry asks when it is due.
func (l *RateLimiter) admits(ctx context.Context, delay time.Duration) bool {
	now := time.Now()
	due := now.Add(delay)
	l.mu.Lock()
	defer l.mu.Unlock()
	ok := !l.limited || !l.due(due).After(due.Add(l.longest(ctx, due)))
	if !ok {
		l.refused++
	}
	return ok
}

// longest is the longest wait for an attempt due at due.
func (l *RateLimiter) longest(ctx context.Context, due time.Time) (w time.Duration) {
	if w = time.Duration(math.MaxInt64); l.MaxWait > 0 {
		w = l.MaxWait
	}
	if dl, ok := ctx.Deadline(); ok {
		w = min(w, time.Duration(limWait*float64(dl.Sub(due))))
	}
	return w
}

// due is when a permit asked for at now can come. Must hold mu.
func (l *RateLimiter) due(now time.Time) time.Time { return later(later(l.next, now), l.pause) }

// reserve takes a slot for an attempt due at due, asked for at now (counted
// in the demand when ask), if it comes within longest of due.
func (l *RateLimiter) reserve(now, due time.Time, longest time.Duration, ask bool) (permit, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ask {
		l.demand.add(now)
	}
	if !l.limited {
		l.sent.add(now)
		return permit{l: l}, true
	}
	at := l.due(now)
	if at.Sub(due) > max(longest, 0) {
		l.refused++
		return permit{}, false
	}
	iv := interval(l.rateAt(now))
	l.next = later(l.next, at.Add(-iv)).Add(iv)
	l.sent.add(now)
	return permit{l: l, cuts: l.cuts, slot: iv, at: at}, true
}

// cancel gives back the slot of a permit whose attempt will not be sent: the
// schedule moves one slot earlier, as x/time/rate's Reservation.Cancel
// restores its tokens. It empties p.
func (p *permit) cancel() {
	if l := p.l; l != nil && p.slot > 0 {
		l.mu.Lock()
		if p.cuts == l.cuts { // a cut's new schedule holds no slot of it
			l.next = l.next.Add(-p.slot)
		}
		l.mu.Unlock()
	}
	*p = permit{}
}

// answered reports the answer to the attempt sent under p, classified as
// class: a throttle cuts the rate (once a round) and pauses it for the
// delay a Retry-After asks for, within the Policy's MaxServerDelay; any
// other answer is accepted.
func (p *permit) answered(pol *Policy, resp *http.Response, err error, class Class) {
	l := p.l
	if l == nil {
		return // no limiter: nothing to do, and no clock read
	}
	now, throttled := time.Now(), class == Throttling
	var pause time.Duration
	if d, ok := serverDelay(pol, resp, now); ok && throttled {
		pause = serverPause(pol, d)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.cuts == l.cuts && (err == nil || throttled) { // an error may not have reached the server
		l.answers++
		if !throttled {
			l.accepts++
		}
	}
	switch {
	case !throttled:
		return
	case !l.limited:
		l.cut(now, l.sent.rate(now))
	case p.cuts == l.cuts:
		l.cut(now, min(l.rateAt(now), l.sent.rate(now)))
	}
	if until := now.Add(pause); until.After(l.pause) {
		l.pause = until
	}
}

// rate is Stats().Rate for a limiter that may be nil.
func (l *RateLimiter) rate() (r float64) {
	if l != nil {
		r = l.Stats().Rate
	}
	return r
}

// interval is the gap between permits at r per second.
func interval(r float64) time.Duration { return time.Duration(min(float64(time.Second)/r, 1<<62)) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// A meter is a rate of events, weighted exponentially over limTau seconds
// and divided by the weight of its age (a tenth of limTau at least), so that
// a young meter reads the rate seen so far, not a fraction of it.
type meter struct {
	w         float64
	at, since time.Time
}

func (m *meter) add(now time.Time) {
	if m.since.IsZero() {
		m.since = now
	}
	m.w, m.at = m.weight(now)+1, now
}

func (m *meter) weight(now time.Time) float64 {
	return m.w * math.Exp(-max(now.Sub(m.at).Seconds(), 0)/limTau)
}

func (m *meter) rate(now time.Time) float64 {
	age := now.Sub(m.since).Seconds()
	return m.weight(now) / max(-limTau*math.Expm1(-age/limTau), limTau/10)
}
