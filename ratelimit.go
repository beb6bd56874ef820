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

// The tuned numbers, each earned by an ablation (docs/throttling.md); variables
// only so that the lab can switch one off (ablate.go, tag retryhttp_ablate).
var (
	limBeta   = 0.5  // the least of a rate one cut keeps
	limMargin = 0.1  // how far below the accepted share a cut sets the rate
	limTau    = 1.0  // seconds: the meters' time constant; the rate is at least one per limTau
	limGrowth = 0.05 // the cubic's scale per second cubed, as a share of the demand
	limWait   = 0.1  // the share of the time left that an attempt may wait
	limHold   = 4.0  // seconds: the longest hold at a cut's rate
)

// A RateLimiter paces the attempts of a client that a server throttles. Until
// its first throttle it is free: every attempt goes at once, metered as asked
// for (the demand) and as sent. A throttle (a 429, or what the Policy
// classifies as Throttling) cuts the rate once a round: a throttle of a permit
// given before the last cut was answered by that cut. The first cut keeps
// limBeta squared of the rate sent; a later one keeps the round's accepted
// share less limMargin, and at least limBeta. After a round with limBeta of its
// answers accepted, the cut's rate is held twice as long as the last, up to
// limHold; after a worse one, a fall of the capacity, not at all. Then the rate
// grows along a cubic, as CUBIC's window does: concave back to the rate that
// drew the throttle (recovering), then convex past it (probing). The cubic's
// scale is limGrowth of the demand, so that clients grow in proportion to what
// they ask. The rate is never less than one permit per limTau. Permits are one
// interval of the rate apart, a slot unused for up to an interval is kept for
// the next attempt, and a cut starts a new schedule: attempts waiting under the
// last ask again. An attempt waits only within limWait of the time left before
// its deadline, and within MaxWait: no queue stands, and the rest fail at once
// with ErrRateLimited. A refused attempt sends nothing and holds no slot; a
// canceled permit gives its slot back, whatever the order of cancels. A
// throttle with Retry-After (or x-amz-retry-after) holds the rate until the
// time the server asked for; after a fall it pauses the limiter, which gives no
// permit before then.
//
// The zero RateLimiter is ready to use, and safe for concurrent use by the
// Transports of one dependency. It starts no goroutine and no timer.
type RateLimiter struct {
	// MaxWait bounds an attempt's wait for its permit; zero means no bound
	// but the deadline's. It must not change after first use.
	MaxWait          time.Duration
	mu               sync.Mutex
	limited, fell    bool    // a throttle came (not free); the last cut's round fell
	demand, sent     meter   // attempts asked for, and sent, per second
	answers, accepts int     // answers to the permits of this round, and those accepted
	top, low         float64 // the rate that drew the last throttle, and the cut's
	hold             float64 // seconds the cut's rate is held before the cubic
	scale, plateau   float64 // the cubic's scale, and seconds from the cubic's start to top
	cutAt, next      time.Time
	pause            time.Time // no permit before (Retry-After, after a fall)
	cuts             uint64
	refused          int64
}

// The states of a RateLimiter, as RateLimiterStats.State names them.
type limiterState uint8

const (
	free       limiterState = iota // no throttle yet: no limit
	recovering                     // below the rate that drew the last throttle
	probing                        // at or past it
	paused                         // within a Retry-After, after a fall
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
	return RateLimiterStats{State: stateNames[l.state(now)], Rate: l.rateAt(now), Cuts: l.cuts, Refused: l.refused}
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

// rateAt is the cubic at now, within its bounds; 0 while free. Must hold mu.
func (l *RateLimiter) rateAt(now time.Time) float64 {
	r := l.low
	if !l.limited {
		return 0
	} else if t := now.Sub(l.cutAt).Seconds() - l.hold; t > 0 {
		t -= l.plateau
		r = l.top + l.scale*t*t*t
	}
	return max(r, 1/limTau)
}

// cut answers a throttle at now: of the round's permits, or the first. The
// rate that drew it is the rate sent, or the limit if lower. Must hold mu.
func (l *RateLimiter) cut(now time.Time) {
	top := max(l.sent.rate(now), 1/limTau)
	if l.limited {
		top = min(top, l.rateAt(now)) // at least 1/limTau, as both are
	}
	kept := float64(l.accepts) / float64(l.answers)
	low := top * max(limBeta, kept*(1-limMargin))
	if !l.limited {
		low = top * limBeta * limBeta // the first: the capacity is unknown
	}
	hold := min(2*l.hold+l.plateau, limHold) // twice the last; none after a fall
	if l.fell = kept < limBeta; l.fell || !l.limited {
		hold = 0
	}
	l.top, l.low, l.hold = top, low, hold
	l.scale = limGrowth * max(l.demand.rate(now), l.low)
	l.plateau = math.Cbrt((l.top - l.low) / l.scale)
	l.cutAt, l.limited = now, true
	l.answers, l.accepts = 0, 0
	l.next = now.Add(time.Duration(float64(time.Second) / l.low)) // a new schedule: the permits of the last are void
	l.cuts++
}

// A permit is an attempt's right to be sent: answered once it is sent, or
// canceled, which gives its slot back (a free limiter's holds none).
type permit struct {
	l      *RateLimiter
	cuts   uint64        // the cuts made before it was given: its round
	slot   time.Duration // the interval it took
	at     time.Time     // when its attempt may be sent
	waited time.Duration // how long the attempt waited for it
}

// acquire waits for a permit into into, or holds nothing and returns why. A
// cut or a pause during the wait voids the permit: it asks again. With
// need > 0, a permit after which an attempt of need would end past the
// context's deadline is given back: errTooLate.
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
			err := sleep(ctx, d)
			l.mu.Lock()
			void := err != nil || p.cuts != l.cuts || p.at.Before(l.pause)
			l.mu.Unlock()
			if void {
				p.cancel()
				if err != nil {
					return err
				}
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
	return max(l.free(due).Sub(due), 0)
}

// admits reports whether a retry after delay would get a permit in time.
func (l *RateLimiter) admits(ctx context.Context, delay time.Duration) bool {
	due := time.Now().Add(delay)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.limited && l.free(due).After(due.Add(l.longest(ctx, due))) {
		l.refused++
		return false
	}
	return true
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

// reserve takes a slot within longest of due, asked for at now (a demand if ask).
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
	at := l.free(now)
	if at.Sub(due) > max(longest, 0) {
		l.refused++
		return permit{}, false
	}
	iv := time.Duration(float64(time.Second) / l.rateAt(now)) // the interval
	l.next = later(l.next, at.Add(-iv)).Add(iv)
	l.sent.add(now)
	return permit{l: l, cuts: l.cuts, slot: iv, at: at}, true
}

// cancel gives a permit's slot back, as x/time/rate's Reservation.Cancel
// does, and empties p.
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

// answered reports the answer to p's attempt: a throttle cuts (once a round),
// and its Retry-After, within MaxServerDelay, holds or pauses the rate.
func (p *permit) answered(pol *Policy, resp *http.Response, err error, class Class) {
	l := p.l
	if l == nil {
		return // no limiter: nothing to do, and no clock read
	}
	now, throttled := time.Now(), class == Throttling
	d, ok := serverDelay(pol, resp, now)
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.cuts == l.cuts && (err == nil || throttled) { // an error may not have reached the server
		l.answers++
		if !throttled {
			l.accepts++
		}
	}
	if throttled && (!l.limited || p.cuts == l.cuts) {
		l.cut(now)
	}
	if pause := serverPause(pol, d); ok && throttled && pause > 0 && l.fell {
		l.pause = later(l.pause, now.Add(pause))
	} else if ok && throttled && pause > 0 { // held until then, at least
		l.hold = max(l.hold, now.Add(pause).Sub(l.cutAt).Seconds())
	}
}

// free is the first time at or after t that a permit may be sent for.
// Must hold mu.
func (l *RateLimiter) free(t time.Time) time.Time { return later(later(l.next, t), l.pause) }

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// A meter is a rate of events, weighted exponentially over limTau and divided
// by the weight of its age (limTau/10 at least): a young one reads it whole.
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
	return m.weight(now) / max(-limTau*math.Expm1(-now.Sub(m.since).Seconds()/limTau), limTau/10)
}
