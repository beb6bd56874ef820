package retryhttp

import (
	"context"
	"errors"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Adaptive client-side rate limiting: a budget stops retries, but a client
// that is being throttled also has to slow its first attempts. The AWS SDKs'
// adaptive retry mode does it with a rate cut to 0.7 on every throttle and
// grown back along a cubic curve (aws-sdk-go-v2, aws/retry/adaptive*.go).
// Measured on a matrix of workloads (bench/matrix.go, docs/throttling.md),
// a fixed cut and a timed regrowth either leave capacity unused or keep
// probing past it, and a queue of callers in front of the limiter fills to
// their deadline. RateLimiter estimates instead of assuming:
//
//   - A round is the permits given since the last cut; its answers tell
//     what share of the attempts the server accepted. A throttle cuts the
//     rate to what was accepted (the accepted rate, or the rate times the
//     accepted share, whichever is lower), minus a margin: one cut per
//     round, as a throttle answering a permit given before the last cut was
//     already answered by that cut. A round of throttles with nothing
//     accepted between them halves the rate once more for each.
//   - Starting: until it has gone a while without a throttle, a limiter
//     keeps its rate as a share of its demand (the attempts asked for per
//     second) and cuts the share by at least 1-Beta on each throttle. Every
//     client of a server that starts throttling them cuts by the same
//     factors, so they start with rates in proportion to their demands
//     (fair), whatever the noise of a few first answers. A cut also sets a
//     ceiling, lower than the one before: the rate that drew the throttle
//     (the higher of the rate now and the rate its attempt was sent at, or
//     for the first, the rate sent before it when measured over a whole
//     window that began within the last second) times the cut. The demand
//     measured may rise after a cut, as a young meter does, without undoing
//     it.
//   - Holding: a rate that draws no throttle is held; a throttle while
//     holding means the server got tighter for this client (its capacity
//     fell, or other clients took more), and cuts a fifth more than the
//     estimate, so that the clients sending most, which draw most of such
//     throttles, give back most.
//   - Probing: from time to time the rate steps up by a fiftieth of the
//     demand (equal steps for equal demands, a pull toward equal shares).
//     A throttle soon after a step takes it back with 3% of the rate (the
//     clients above the others give back most), and the next probe waits
//     twice as long (up to Recovery); a step that holds is kept, and the
//     next comes twice as soon (down to a tenth of Recovery); a step past
//     twice the demand was not tried, and is not kept. Steps kept in a row
//     past the last rate known to be too much (where the last throttle
//     came, or for a step that found no room, the rate it stepped from)
//     mean the capacity grew: from the second on, each doubles the next
//     (up to 32 times), so that a capacity that rose without falling first
//     is found in a few steps. So do steps kept after 4 s without a
//     throttle (or a pause) by a limiter whose demand is three times its
//     rate or more: below top, a rate left low by the start's last cuts
//     climbs at 2% of the demand a step, and a capacity that rose
//     meanwhile is found only once top is passed. A limiter that asks for
//     less than three times its rate, or draws throttles every few
//     seconds, is near its share: its steps double no further (until a
//     cut, they keep the size they reached).
//   - Coming back: a limiter remembers the rate it held before a deep cut
//     (or sent, unlimited, for 5 s before its first throttle); while far
//     below it, it ramps back up every 1.5 s, fast, and keeps the old
//     rate if the ramp reaches it, as far as it was tested (up to twice
//     the demand; not at all through a pause). A capacity that returns is
//     found within seconds; one that does not costs one throttle a ramp,
//     and the ramps stop after a few tries per halving of the rate.
//   - Waiting: permits are spaced evenly at the rate, the next one an
//     interval of the rate now after the last (a ramp from a low rate
//     does not wait out the low rate's long interval). An attempt waits for
//     one only if it comes within 20 permits' time (a bounded queue: the
//     rest fail at once rather than queue to their deadline) and leaves
//     room before the request's deadline for the attempt itself, estimated
//     from the attempts' latencies as TCP estimates a retransmission
//     timeout (RFC 6298: smoothed latency plus four times its deviation).
//   - A 429 that carries Retry-After (or x-amz-retry-after) pauses the
//     limiter until then: no permit is given before it.

// Defaults of a RateLimiter's zero fields.
const (
	// DefaultLimiterBeta is the most a starting limiter keeps of its rate
	// on a throttle: CUBIC's and the AWS SDKs' 0.7.
	DefaultLimiterBeta = 0.7
	// DefaultLimiterRecovery is the longest a limiter waits between two
	// probes above a rate it holds.
	DefaultLimiterRecovery = 20 * time.Second
	// DefaultLimiterMinRate is the lowest rate, in permits per second.
	DefaultLimiterMinRate = 0.1
)

// The rest of the model: fixed, measured on the matrix (docs/throttling.md).
const (
	// idleRoll is how many sends an idle limiter counts between two
	// readings of the clock.
	idleRoll = 64
	// minMeasure is the shortest span a rate is measured over, so that
	// the first few sends do not read as a huge rate.
	minMeasure = 100 * time.Millisecond
	// meterTau is the time constant of the demand and accepted-rate
	// meters (exponentially weighted).
	meterTau = 1.0
	// demandCap bounds the rate at twice the demand, so that a quiet
	// client does not build up a rate it could not have tested.
	demandCap = 2.0
	// margin is how far below its estimate a cut sets the rate.
	margin = 0.03
	// holdCut is the extra cut of a throttle that comes while holding.
	holdCut = 0.2
	// probeCut is what a probe step that drew a throttle takes off the
	// level besides the step. Clients that share a server draw most of
	// their throttles with their own steps: without a cut for them, no
	// client ever gives back what an unlucky start left it above the
	// others.
	probeCut = 0.03
	// minShare is the least share of the demand a start keeps, so that it
	// never reaches 0, which marks the start's end.
	minShare = 1e-9
	// minKeep is the most one cut takes off (but for a run of throttles).
	minKeep = 0.5
	// prior is the answers a round counts before any: one throttle among
	// few answers is weak evidence.
	prior = 2.0
	// settle is how long without a throttle ends the start, and within
	// how long of a cut another throttle refines the estimate rather than
	// counting as one while holding.
	settle = 2 * time.Second
	// recent: a send rate measured over a window that began at most this
	// long before the first throttle is the rate sent then, not an average
	// over an idle spell.
	recent = time.Second
	// exactRound, exactAccepts: a round shorter than this, with at least
	// this many answers accepted, started and ended with the server
	// refusing, so its accepted count over its length is the rate the
	// server grants this client.
	exactRound   = 2 * time.Second
	exactAccepts = 4
	// probeStep is a probe's step, as a share of the demand.
	probeStep = 0.02
	// maxDoublings: past the rate the last throttle came at, each step
	// kept in a row after the first doubles the next, up to this many
	// times.
	maxDoublings = 5
	// quiet and quietDemand: a step kept at least quiet after the last cut
	// and the end of any pause, with the demand at least quietDemand times
	// the level, counts toward doubling as one past top does.
	quiet       = 4 * time.Second
	quietDemand = 3.0
	// firstProbe is the wait for the first probe after the start.
	firstProbe = 500 * time.Millisecond
	// blame is how long after its step a throttle takes the step back.
	blame = 1500 * time.Millisecond
	// farRatio: a rate below this share of the remembered one is far
	// below it; heldFor is how long a rate must have gone without a
	// throttle to be remembered; forget is the time constant over which
	// the memory fades.
	farRatio = 0.7
	heldFor  = 5 * time.Second
	forget   = 300.0
	// rampWait and rampTau: a ramp back starts this long after the last
	// change and grows e-fold every rampTau; rampTries is how many ramps
	// are tried per halving of the rate.
	rampWait  = 1500 * time.Millisecond
	rampTau   = 0.3
	rampTries = 3.0
	// queuePermits bounds the wait for a permit at this many permits'
	// time.
	queuePermits = 20
)

// ErrRateLimited is the error of a request whose next attempt could not get
// a send permit: the permit would come too late to leave room for the
// attempt before the request's deadline, beyond RateLimiter.MaxWait, or
// behind a queue of 20 permits. Nothing was sent for that attempt.
var ErrRateLimited = errors.New("retryhttp: no send permit before the deadline")

// A RateLimiter slows a client that is being throttled: every attempt, the
// first of a request included, waits for a send permit, and permits come at
// a rate estimated from the throttling responses (429, or what the Policy
// classifies as Throttling) and the other answers to the attempts sent
// under them.
//
// Until its first throttle, a RateLimiter only counts what is sent: it lets
// everything through. Then it cuts its rate to what the server accepted,
// holds it while no throttle comes, probes above it from time to time, and
// ramps back toward a rate it held before a deep cut: the model is
// described in ratelimiter.go and measured in docs/throttling.md. A request
// whose permit would come too late (see ErrRateLimited) fails at once
// rather than waiting for nothing. A 429 with Retry-After pauses it until
// then.
//
// The zero RateLimiter is ready to use with the defaults above. It is safe
// for concurrent use, and several Transports may share one, as they may
// share a Budget, when they call the same dependency: a RateLimiter limits
// everything that goes through it, so give each dependency (each host that
// throttles on its own) a RateLimiter of its own. It starts no goroutine and
// no timer of its own; the waits are the requests' own. Its fields must not
// change after its first use.
type RateLimiter struct {
	// Beta is the most a starting limiter keeps of its rate on a throttle,
	// between 0 and 1: a smaller Beta starts lower and with fewer 429s.
	// Zero, or any value outside (0, 1), NaN included, means
	// DefaultLimiterBeta.
	Beta float64
	// Recovery is the longest wait between two probes above a rate the
	// limiter holds; the shortest is a tenth of it. A longer Recovery
	// means fewer 429s and slower finding of capacity that grew beyond
	// what the limiter held before (docs/throttling.md, "Choosing
	// Recovery", measures both at 5, 10, 20 and 40 s).
	// Zero or a negative value means DefaultLimiterRecovery.
	Recovery time.Duration
	// MinRate is the lowest rate, in permits per second. Zero, a negative
	// value, NaN or infinity means DefaultLimiterMinRate.
	MinRate float64
	// MaxWait bounds an attempt's whole wait for its permit, across any
	// cuts made while it waits: an attempt whose permit would come later
	// fails with ErrRateLimited at once. Zero means no bound but the
	// request's deadline and the queue's (20 permits).
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
	firstAt            time.Time // of the first send

	epoch   uint64        // cuts so far
	seq     uint64        // permits given so far, once limiting
	refused int64         // permits refused
	next    time.Time     // when the next permit is due
	gap     time.Duration // the interval next was scheduled with
	pause   time.Time     // no permit before (Retry-After)
	holes   []permit      // canceled permits of this round with live ones after them

	share  float64       // while starting: the rate's share of the demand; 0 after
	ceil   float64       // while starting: the most the rate may be; +Inf if none
	stale  bool          // until the first cut's round ends: the start was seeded with an old average
	level  float64       // after the start: the rate held
	step   float64       // the next probe's step
	period time.Duration // from one change of the level to the next probe
	change time.Time     // when the level last changed
	cutAt  time.Time     // when the last cut was made

	top    float64   // the rate the last throttle came at; a failed step's level
	above  int       // probe steps kept in a row past top or quiet (see quiet)
	high   float64   // the rate held before a deep cut, fading
	highAt time.Time // when high was last updated
	ramps  int       // ramps back to high that failed

	answers, throttles int // since the last cut
	run                int // throttles in a row, nothing accepted between
	accepted, demand   meter
	srtt, rttvar       float64 // attempt latency, in seconds; srtt 0 until known
}

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
	// Refused counts the attempts that got no permit (see ErrRateLimited)
	// and were not made.
	Refused int64
}

// Stats reports the limiter's state.
func (l *RateLimiter) Stats() RateLimiterStats {
	if !l.limiting.Load() {
		return RateLimiterStats{}
	}
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	return RateLimiterStats{Rate: l.rateAt(now, now), Cuts: l.epoch, Refused: l.refused}
}

// rateAt is the rate of the permit due at at, asked at now: the start's
// share of the demand up to its ceiling, or the level with its probe or
// ramp; at most twice the demand, never below MinRate. Must hold mu.
func (l *RateLimiter) rateAt(at, now time.Time) float64 {
	dem := l.demand.rate(now)
	r := min(l.share*dem, l.ceil)
	if l.share == 0 {
		r = l.scheduled(at)
	}
	if dem > 0 {
		r = min(r, demandCap*dem)
	}
	return max(r, l.minRate())
}

// far reports whether the level is far below the rate remembered, and
// ramps back to it are still worth trying: a few per halving.
func (l *RateLimiter) far() bool {
	return l.high > l.level && l.level < farRatio*l.high &&
		float64(l.ramps) < rampTries*math.Log2(l.high/l.level)
}

// scheduled is the rate at at after the start, before the demand cap: the
// level, its probe step once the period has passed since the last change,
// or, far below the rate remembered, a ramp back to it. Must hold mu.
func (l *RateLimiter) scheduled(at time.Time) float64 {
	dt := at.Sub(l.change)
	switch {
	case l.far():
		if dt < rampWait {
			return l.level
		}
		return min(l.high, l.level*math.Exp(min((dt-rampWait).Seconds()/rampTau, 50)))
	case dt < l.period:
		return l.level
	default:
		return l.level + l.step
	}
}

// advance brings the state to now: the start ends after settle without a
// throttle; a probe step that drew no throttle within blame is kept, and
// so is a ramp that reached the rate remembered. Must hold mu.
func (l *RateLimiter) advance(now time.Time) {
	if l.share > 0 {
		if now.Sub(l.cutAt) < settle {
			return
		}
		l.level = max(min(l.share*l.demand.rate(now), l.ceil), l.minRate())
		l.share = 0
		if l.top == 0 {
			// Every cut of the start was a stale one's: the throttle came
			// at the rate sent then, the demand.
			l.top = l.demand.rate(now)
		}
		l.change, l.period = now, firstProbe
		l.step = l.probeStep(now)
	}
	for range 8 { // steps kept since the last call; a handful at most
		if l.far() {
			reach := rampWait + time.Duration(rampTau*math.Log(l.high/l.level)*float64(time.Second))
			if now.Sub(l.change) < reach+blame {
				return
			}
			tested := min(l.high, l.tested(l.change.Add(reach+blame), now))
			l.change = l.change.Add(reach)
			if tested <= l.level {
				continue // the sends tested it no higher than the level
			}
			// The ramp reached the rate remembered and held, as far as it
			// was tested.
			l.level = tested
			l.period = l.recovery() / 10
			l.step = l.probeStep(now)
			continue
		}
		at := l.change.Add(l.period)
		if now.Sub(at) < blame {
			return
		}
		if l.level+l.step > l.tested(at.Add(blame), now) {
			// Nothing sent tested the step: it is not kept.
			l.change = at
			continue
		}
		l.level += l.step
		if l.level > l.top || l.quiet(at, now) {
			l.above++
		}
		l.change = at
		l.period = max(l.recovery()/10, l.period/2)
		l.step = l.probeStep(now)
	}
}

// tested is the highest rate that the sends of a step or a ramp whose blame
// window ended at end could have tested, read at now: twice the demand
// then (the rate is never more), or 0 if a pause kept anything from being
// sent until end. The demand is read at end, not now, as the meter last
// read it (the events since included), so that a call that comes late
// does not find a window untested because the demand stopped after it.
// Must hold mu.
func (l *RateLimiter) tested(end, now time.Time) float64 {
	if !l.pause.Before(end) {
		return 0
	}
	return demandCap * l.demandBy(end, now)
}

// demandBy is the demand when a window that ends at end ended, read at now:
// at end, or at now if it has not ended yet. Must hold mu.
func (l *RateLimiter) demandBy(end, now time.Time) float64 {
	if end.After(now) {
		end = now
	}
	return l.demand.rate(end)
}

// quiet reports whether a step due at at and kept, asked at now, was quiet
// enough to count toward doubling though below top: quiet after the last
// cut and the end of any pause (nothing sent, nothing could be throttled),
// with a demand, read when its blame window ended, of quietDemand times the
// level or more. Must hold mu.
func (l *RateLimiter) quiet(at, now time.Time) bool {
	return at.Sub(later(l.cutAt, l.pause)) >= quiet && l.demandBy(at.Add(blame), now) >= quietDemand*l.level
}

// probeStep is the size of a probe: a share of the demand, or of the level
// when the demand is lower, doubled for each step kept in a row above top
// (or quiet) but the first (the capacity grew: it is found in a few steps
// rather than at a fiftieth of the demand each). Must hold mu.
func (l *RateLimiter) probeStep(now time.Time) float64 {
	doublings := min(max(l.above-1, 0), maxDoublings)
	return probeStep * max(l.demand.rate(now), l.level) * float64(int(1)<<doublings)
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
		if n == 1 {
			l.firstAt = now
		}
		l.mu.Unlock()
	}
}

// startLimiting ends the idle state at the first throttle. The send rate is
// the higher of two measures: since the last mark (over minMeasure at
// least), and between the two marks. After a long idle spell the older
// measure spans it and reads low; just after a mark the newer one has seen
// few sends; either way the other one reads the recent rate. What was sent
// until then was accepted: it seeds the demand and accepted-rate meters and
// the round's answers, and, sent for heldFor at least, is remembered as a
// rate held. A rate measured over a whole window (not floored at
// minMeasure) that began within the last second (recent) is the rate sent
// at the throttle, and the first cut's ceiling is below it. Must hold mu.
func (l *RateLimiter) startLimiting(now time.Time) {
	var rate float64
	span := minMeasure
	from, whole := now, false // when the window measured began; whether it was measured whole
	sent := l.idleSent.Load()
	if l.markAt.IsZero() {
		// Sent, but the first mark is not taken yet (a throttle of another
		// goroutine's attempt came first): that many within minMeasure.
		rate = float64(sent) / span.Seconds()
	} else {
		w := now.Sub(l.markAt)
		span = max(w, minMeasure)
		rate = float64(sent-l.mark) / span.Seconds()
		from, whole = l.markAt, w >= minMeasure
	}
	if !l.prevMarkAt.IsZero() {
		w := l.markAt.Sub(l.prevMarkAt)
		s := max(w, minMeasure)
		if r := float64(l.mark-l.prevMark) / s.Seconds(); r > rate {
			rate, span = r, s
			from, whole = l.prevMarkAt, w >= minMeasure
		}
	}
	l.demand.seed(now, rate, span)
	l.accepted.seed(now, rate, span)
	if !l.firstAt.IsZero() && now.Sub(l.firstAt) >= heldFor {
		// A rate sent unlimited for a while is one the server took: a
		// rate to come back to, as one held.
		l.high, l.highAt = rate, now
	}
	l.answers, l.throttles = int(math.Round(rate*span.Seconds())), 0
	l.share, l.ceil = 1, math.Inf(1)
	if whole && now.Sub(from) <= recent && rate > 0 {
		l.ceil = rate
	}
	// A window that began long before the throttle (an idle spell in it)
	// gives an average, not the rate sent now: the start is stale until
	// the demand is measured again.
	l.stale = now.Sub(from) > recent
	l.cutAt = now
	l.limiting.Store(true)
}

// cut answers a throttle of the current round at now. Must hold mu.
func (l *RateLimiter) cut(now time.Time, slot time.Duration) {
	l.advance(now)
	refused := float64(l.throttles) / (float64(l.answers) + prior)
	// The accepted rate: over the round when it was short and refused at
	// both ends, or as measured.
	acc := l.accepted.rate(now)
	if span := now.Sub(l.cutAt); l.epoch > 0 && span < exactRound && l.answers-l.throttles >= exactAccepts {
		acc = float64(l.answers-l.throttles) / span.Seconds()
	}
	if l.share > 0 {
		// The rate now, and the rate that drew the throttle: the higher of
		// it and the rate the attempt was sent at (the demand measured may
		// have fallen since); for an attempt sent before the first
		// throttle, the ceiling startLimiting measured, if any.
		r := min(l.share*l.demand.rate(now), l.ceil)
		sent := math.Inf(1)
		if slot > 0 && !l.stale { // a stale start's slot is an old average's
			sent = max(r, 1/slot.Seconds())
		}
		keep := 1 - refused
		if r > 0 && now.Sub(l.cutAt) < exactRound && l.epoch > 0 && l.answers-l.throttles >= exactAccepts {
			keep = min(keep, acc/r)
		}
		k := min(max(keep, minKeep), l.beta())
		l.share = max(l.share*k, minShare) // 0 would end the start
		if !l.stale {
			l.top = r // (a stale start's rate is an old average's, not the rate sent)
		}
		l.ceil = k * min(sent, l.ceil)
	} else {
		r, held := l.scheduled(now), l.level
		est := min(r*(1-refused), acc)
		if l.run >= 2 {
			est = min(est, r*math.Pow(0.5, float64(l.run-1)))
		}
		dt := now.Sub(l.change)
		switch {
		case l.far() && dt >= rampWait:
			l.ramps++ // the ramp found no room: back to the level
			l.top = r
		case !l.far() && dt >= l.period:
			l.period = min(l.recovery(), 2*l.period) // the step found no room: back to the level
			// The room ends within a step of the level: steps past it
			// count toward doubling from the first.
			l.top = l.level
			cut := l.level * (1 - probeCut)
			if l.level >= farRatio*l.high {
				cut = max(cut, farRatio*l.high) // not a fall to ramp back from
			}
			l.level = cut
		case now.Sub(l.cutAt) < settle:
			l.level = min(max(est*(1-margin), minKeep*r), r*(1-margin))
		default:
			l.level = min(r, est) * min(max(1-refused, minKeep), 1-holdCut)
			l.top = r
		}
		l.above = 0
		h := l.high * math.Exp(-now.Sub(l.highAt).Seconds()/forget)
		if now.Sub(l.cutAt) >= heldFor && held > h {
			h, l.ramps = held, 0
		}
		l.high, l.highAt = h, now
		l.level = max(l.level, l.minRate())
		l.change = now
		l.step = l.probeStep(now)
	}
	l.cutAt = now
	l.epoch++
	l.holes = l.holes[:0]
	l.answers, l.throttles = 0, 0
	// The next permit is one interval of the new rate away; attempts
	// already waiting take new permits (see acquire).
	l.gap = interval(l.rateAt(now, now))
	l.next = now.Add(l.gap)
	l.stale = l.stale && l.epoch == 1
	if l.share > 0 && (l.stale || l.demand.rate(now) == 0) {
		// A start with no demand measured, or an old average of it: the
		// first permit comes at once, and the ones after it follow the
		// demand as it is measured again (see due).
		l.next = now
	}
}

// A permit is an attempt's right to be sent, from a RateLimiter. It is a
// value owned by the attempt: used once the attempt is sent (its answer
// then reaches the limiter through answered), or canceled when the attempt
// will not be sent, which gives its slot back. The zero permit is no
// permit; an idle limiter's permits hold no slot.
type permit struct {
	l      *RateLimiter
	epoch  uint64        // the cuts made before it was given
	seq    uint64        // the permits given before it
	slot   time.Duration // the interval it took; zero for an idle limiter's
	gap    time.Duration // the limiter's gap before it, restored if it is canceled
	prev   time.Time     // the limiter's next before it, restored if it is canceled
	at     time.Time     // when it is due: when its attempt is sent
	waited time.Duration // how long the attempt waited for it
}

// acquire waits for a permit for an attempt due now, until it holds one of
// the current round (a cut or a pause during the wait voids the slot taken
// before it), and puts it in into. It returns ErrRateLimited, without
// waiting for nothing, when the permit would come too late (see
// ErrRateLimited), or the context's error when it ends first; either way it
// holds nothing.
func (l *RateLimiter) acquire(ctx context.Context, into *permit) error {
	if !l.limiting.Load() {
		l.countIdle(time.Time{})
		*into = permit{l: l}
		return nil
	}
	deadline, _ := ctx.Deadline()
	due := time.Now()
	slept := false
	for asked := false; ; asked = true {
		now := time.Now()
		p, ok := l.reserve(due, now, deadline, !asked)
		if !ok {
			return ErrRateLimited
		}
		if d := p.at.Sub(now); d > 0 {
			if err := sleep(ctx, d); err != nil {
				p.cancel()
				return err
			}
			slept = true
			if !l.valid(&p) {
				// Cut or paused while waiting: a cut voided the slot; a
				// pause's is given back, and a new permit is taken.
				p.cancel()
				continue
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
	if l.due(now).After(now) {
		return permit{}, false
	}
	return l.give(now, now), true
}

// reserve takes the slot of an attempt due at due, asked at now (counting
// it in the demand when ask), and reports it with when it comes. It takes
// nothing and reports false when the slot would come too late.
func (l *RateLimiter) reserve(due, now, deadline time.Time, ask bool) (permit, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ask {
		l.demand.add(now)
	}
	at := l.due(now)
	if !l.permitted(at, due, now, deadline) {
		l.refused++
		return permit{}, false
	}
	return l.give(at, now), true
}

// due is when the next permit can come, asked at now: not before a pause,
// and, after the start, one interval of the rate now after the permit
// before it. The next permit was scheduled at the rate of its time; when a
// probe or a ramp back has raised the rate since, the wait shortens with
// it, or a client cut to a low rate would wait out the long interval of
// that rate before its ramp could send anything. While starting, the rate
// follows the demand, which every attempt asked moves, so the permit keeps
// the interval it was given, unless the start is stale: an old average of
// the demand is not a rate to wait out. Must hold mu.
func (l *RateLimiter) due(now time.Time) time.Time {
	next := l.next
	if (l.share == 0 || l.stale) && next.After(now) {
		if iv := interval(l.rateAt(now, now)); iv < l.gap {
			next = next.Add(iv - l.gap)
		}
	}
	return later(later(next, now), l.pause)
}

// give hands out the permit at at, asked at now. Must hold mu.
func (l *RateLimiter) give(at, now time.Time) permit {
	l.advance(now)
	iv := interval(l.rateAt(at, now))
	gap, prev := l.gap, l.next
	l.next, l.gap = at.Add(iv), iv
	l.seq++
	return permit{l: l, epoch: l.epoch, seq: l.seq, slot: iv, gap: gap, prev: prev, at: at}
}

// permitted reports whether a permit at at, for an attempt due at due,
// asked at now, leaves room for the attempt before deadline (if not zero),
// comes within MaxWait and within queuePermits of the rate: the lower of
// the rate now and at the permit's time, as a ramp or a probe that starts
// during the wait makes the wait no longer, and never above the rate the
// permits ahead were given at: asks refused in a burst raise the demand
// measured, not the queue ahead. Must hold mu.
func (l *RateLimiter) permitted(at, due, now, deadline time.Time) bool {
	wait := at.Sub(due)
	return (deadline.IsZero() || at.Add(l.room()).Before(deadline)) &&
		(l.MaxWait <= 0 || wait <= l.MaxWait) &&
		wait.Seconds()*min(l.rateAt(at, now), l.rateAt(now, now), 1/l.gap.Seconds()) <= queuePermits
}

// room is the time an attempt is expected to take: the smoothed latency
// plus four times its deviation (RFC 6298). Must hold mu.
func (l *RateLimiter) room() time.Duration {
	return time.Duration((l.srtt + 4*l.rttvar) * float64(time.Second))
}

// valid reports whether p is still good when its attempt wakes for it: no
// cut since, and not inside a pause.
func (l *RateLimiter) valid(p *permit) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return p.epoch == l.epoch && !p.at.Before(l.pause)
}

// cancel gives back the slot of a permit whose attempt will not be sent, as
// x/time/rate's Reservation.Cancel does: if no permit was given after it
// (or every one given after it was canceled), the limiter's schedule is
// as before it was given, never before now. A slot with later permits
// behind it stays taken: giving it back would let the next permit come
// right after the one before it, a burst. A permit of a round since cut
// holds no slot (the cut voided it), nor does an idle limiter's. It
// empties p.
func (p *permit) cancel() {
	l := p.l
	if l == nil || p.slot == 0 {
		*p = permit{}
		return
	}
	now := time.Now()
	l.mu.Lock()
	if p.epoch == l.epoch {
		l.holes = append(l.holes, *p)
		// While the last permit given is canceled, the limiter is as
		// before it was given: the next one comes after the one before
		// it, at the interval that one was given with (see due), and
		// that one is the last given again. A canceled permit with live
		// ones after it waits in holes until they are canceled too.
		for i := 0; i < len(l.holes); {
			if h := l.holes[i]; h.epoch == l.epoch && h.seq == l.seq {
				l.next, l.gap = later(h.prev, now), h.gap
				l.seq--
				l.holes = append(l.holes[:i], l.holes[i+1:]...)
				i = 0
				continue
			}
			i++
		}
	}
	l.mu.Unlock()
	*p = permit{}
}

// answered reports the answer to the attempt sent under p, classified as
// class: a throttle (with the delay a Retry-After asks for, within the
// Policy's MaxServerDelay), and, once the limiter limits, every answer, for
// the round's accepted share and the attempts' latency. An idle limiter's
// permit costs a comparison on success.
func (p *permit) answered(pol *Policy, resp *http.Response, err error, class Class) {
	if p.l == nil || (p.slot == 0 && class != Throttling) {
		return
	}
	p.l.answer(p, pol, resp, err, class)
}

// answer is answered's work.
func (l *RateLimiter) answer(p *permit, pol *Policy, resp *http.Response, err error, class Class) {
	now := time.Now()
	throttled := class == Throttling
	var pause time.Duration
	if throttled {
		if d, ok := serverDelay(pol, resp, now); ok {
			pause = serverPause(pol, d)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if throttled && !l.limiting.Load() {
		l.startLimiting(now)
	}
	if err == nil && p.slot != 0 {
		l.sample(now.Sub(p.at).Seconds())
	}
	if err == nil || throttled { // an error may not have reached the server
		l.answers++
		if throttled {
			l.throttles++
			l.run++
		} else {
			l.run = 0
			l.accepted.add(now)
		}
	}
	if !throttled {
		return
	}
	if p.epoch == l.epoch {
		l.cut(now, p.slot)
	}
	// After the cut: the steps and ramps it finds tested came before
	// this pause.
	if until := now.Add(pause); pause > 0 && until.After(l.pause) {
		l.pause = until
	}
}

// sample adds an attempt's latency, in seconds, to the estimate (RFC 6298's
// gains). Must hold mu.
func (l *RateLimiter) sample(s float64) {
	if l.srtt == 0 {
		l.srtt, l.rttvar = s, s/2
		return
	}
	l.rttvar = 0.75*l.rttvar + 0.25*math.Abs(l.srtt-s)
	l.srtt = 0.875*l.srtt + 0.125*s
}

// interval is the gap between two permits at rate r per second, at most
// 1<<62 ns (146 years) for a rate near 0, as a Duration holds no more.
func interval(r float64) time.Duration {
	if d := float64(time.Second) / r; d < 1<<62 {
		return time.Duration(d)
	}
	return 1 << 62
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// rate is Rate for a Limiter that may be nil.
func (l *RateLimiter) rate() float64 {
	if l == nil {
		return 0
	}
	return l.Rate()
}

// admits reports whether a retry that backoff would send after delay can
// get a permit in time (see ErrRateLimited): if not, it is not made, and the
// response that called for it is returned. It takes nothing: the retry
// takes its permit when it is due (acquire), so that a retry planned far
// ahead holds no slot that other attempts could use.
func (l *RateLimiter) admits(ctx context.Context, delay time.Duration) bool {
	if !l.limiting.Load() {
		return true
	}
	deadline, _ := ctx.Deadline()
	now := time.Now()
	due := now.Add(delay)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.permitted(later(l.due(now), due), due, now, deadline) {
		l.refused++
		return false
	}
	return true
}

// A meter is a rate of events, exponentially weighted over meterTau and
// divided by the weight of its age, so that a young meter reads the rate
// seen so far rather than a fraction of it.
type meter struct {
	w         float64
	at, since time.Time
}

func (m *meter) decay(now time.Time) {
	if dt := now.Sub(m.at).Seconds(); dt > 0 {
		m.w *= math.Exp(-dt / meterTau)
		m.at = now
	}
}

func (m *meter) add(now time.Time) {
	if m.since.IsZero() {
		m.since, m.at = now, now
	}
	m.decay(now)
	m.w++
}

// seed sets the meter as if it had counted rate for span until now.
func (m *meter) seed(now time.Time, rate float64, span time.Duration) {
	m.since, m.at = now.Add(-span), now
	m.w = rate * meterTau * -math.Expm1(-span.Seconds()/meterTau)
}

// rate reads the meter at now (not before its last event).
func (m *meter) rate(now time.Time) float64 {
	if m.since.IsZero() {
		return 0
	}
	w := m.w
	if dt := now.Sub(m.at).Seconds(); dt > 0 {
		w *= math.Exp(-dt / meterTau)
	}
	age := max(now.Sub(m.since), minMeasure).Seconds()
	return w / (meterTau * -math.Expm1(-age/meterTau))
}
