package retryhttp

import (
	"math"
	"sync/atomic"
	"time"
)

// defaultHedgeRatio is the most hedged copies a Transport sends, as a share
// of its hedgeable requests, when Policy.HedgeRatio is zero. It is the share
// of requests slower than a 95th-percentile hedge delay. Dean and Barroso's
// hedged BigTable reads ("The Tail at Scale") cost 2% more requests. gRPC
// throttles hedges with the same token bucket as retries.
const defaultHedgeRatio = 0.05

// A hedging is the state hedges share across requests: the hedges they may
// still send, and the latencies of recent attempts, for an automatic delay.
// A Transport has one, or one per destination with PerHost.
type hedging struct {
	quota hedgeQuota
	lat   latency
}

// lazyHedging holds a hedging made on first use, so that a Transport or a
// destination that never hedges holds none.
type lazyHedging struct{ p atomic.Pointer[hedging] }

func (l *lazyHedging) get() *hedging {
	if hs := l.p.Load(); hs != nil {
		return hs
	}
	l.p.CompareAndSwap(nil, new(hedging))
	return l.p.Load()
}

// hedgeQuota lets hedges be at most a share of requests. It counts in
// units, hedgeUnit of them to a hedge. Every hedgeable request adds the
// share, one unit at least. A hedge takes hedgeUnit units. It starts
// empty, so that a dependency slow for everyone gets no more than the share
// from its first request on. It holds at most hedgeBurst hedges, so that a
// quiet spell does not store up a burst.
type hedgeQuota struct{ units atomic.Int64 }

const (
	hedgeBurst = 10
	hedgeUnit  = 1_000_000_000_000
)

// deposit adds a request's share. A full quota is only read.
func (q *hedgeQuota) deposit(ratio float64) {
	add := max(int64(ratio*hedgeUnit+0.5), 1)
	for {
		cur := q.units.Load()
		if cur >= hedgeBurst*hedgeUnit {
			return
		}
		if q.units.CompareAndSwap(cur, min(cur+add, hedgeBurst*hedgeUnit)) {
			return
		}
	}
}

// take takes one hedge, if the quota holds one and keep units more.
func (q *hedgeQuota) take(keep int64) bool {
	for {
		cur := q.units.Load()
		if cur < hedgeUnit+keep {
			return false
		}
		if q.units.CompareAndSwap(cur, cur-hedgeUnit) {
			return true
		}
	}
}

// refund gives back a hedge: one taken and not sent, or one that won. It
// never fills the quota past hedgeBurst. Deposits made meanwhile may have
// filled it already.
func (q *hedgeQuota) refund() {
	for {
		cur := q.units.Load()
		if cur >= hedgeBurst*hedgeUnit {
			return
		}
		if q.units.CompareAndSwap(cur, min(cur+hedgeUnit, hedgeBurst*hedgeUnit)) {
			return
		}
	}
}

// latency keeps running quantiles of attempt latencies. They serve an
// automatic hedge delay, Policy.AttemptTimeoutQuantile's attempt timeout,
// and the least time an attempt needs (Policy.PropagateDeadline). It counts
// latencies in buckets, latencySubBuckets to a doubling. It keeps two
// generations of latencyWindow samples. The newer one is filled while both
// are read. The estimates are made again at each turn of generations. So
// they follow the last latencyWindow to twice as many attempts. It is
// lock-free: a sample counted as a generation turns may land in the wrong
// one. The zero latency is ready to use.
//
// An attempt cut by the measured timeout is censored. Its latency is
// unknown, and at least that timeout. It is counted apart (cuts), and ranks
// above every latency measured. See cut for the rule that raises the
// timeout when too many are cut.
type latency struct {
	counts [2][latencyBuckets]atomic.Uint32
	cuts   [2]atomic.Uint32 // each generation's censored attempts
	gen    atomic.Uint32    // the generation being filled
	n      atomic.Int64     // samples in it, cut ones included
	est    atomic.Int64     // the hedge quantile at the last estimate, in ns; 0 before
	low    atomic.Int64     // failFastQuantile's bucket's bottom at the last estimate, in ns; 0 before
	turned atomic.Bool      // a generation has turned

	// The measured attempt timeout, in ns; 0 until it forms, from a full
	// window (fresh >= 1). since and cutSince count the attempts and the
	// cuts since the last estimate or raise, for cut's rule.
	timeout  atomic.Int64
	fresh    atomic.Int32 // turns since the window was last emptied
	since    atomic.Int64
	cutSince atomic.Int64
}

const (
	latencyWindow     = 500
	latencySubBuckets = 4                        // per doubling
	latencyMin        = 10 * time.Microsecond    // the first bucket's top
	latencyBuckets    = 24*latencySubBuckets + 1 // bucket 0, then 24 doublings above latencyMin
)

// failFastQuantile is the latency the Transport takes an attempt to need at
// least, with Policy.PropagateDeadline: nine attempts in ten take longer. An
// attempt refused because less time is left would have ended in time at
// most one time in ten.
const failFastQuantile = 0.1

// minAttemptTimeout is the shortest measured attempt timeout. Below a
// millisecond, timer and scheduler delays alone would cut healthy attempts.
const minAttemptTimeout = time.Millisecond

// censorAlarm is the rule that raises a measured attempt timeout: once
// censorAlarm attempts, and more than censorAlarm times the share 1-q of the
// attempts, were cut since the last estimate, the timeout doubles.
const censorAlarm = 4

// quantiles says which estimates a latency keeps, from a Policy: the hedge
// quantile and the timeout quantile (0 for none), and the timeout's ceiling.
type quantiles struct {
	hedge, timeout float64
	ceiling        time.Duration
}

// quantiles is what the Policy's latency estimates are.
func (p *Policy) quantiles() quantiles {
	return quantiles{hedge: p.hedgeQuantile(), timeout: p.attemptTimeoutQuantile(), ceiling: p.AttemptTimeout}
}

// bucket returns the bucket of latency d: bucket 0 holds what is under
// latencyMin, bucket b > 0 the latencies from top(b-1) up to top(b), and
// the last one everything longer.
func bucket(d time.Duration) int {
	x := float64(d) / float64(latencyMin)
	if x < 1 {
		return 0
	}
	m, exp := math.Frexp(x) // x = m·2^exp, m in [0.5, 1)
	frac := int((2*m - 1) * latencySubBuckets)
	return min(1+(exp-1)*latencySubBuckets+frac, latencyBuckets-1)
}

// top returns the top of bucket b: the latencies in it are shorter.
func top(b int) time.Duration {
	if b == 0 {
		return latencyMin
	}
	e, frac := (b-1)/latencySubBuckets, (b-1)%latencySubBuckets
	return time.Duration(math.Ldexp(1+float64(frac+1)/latencySubBuckets, e) * float64(latencyMin))
}

// record counts one attempt's latency, for hedge quantile q alone.
func (l *latency) record(d time.Duration, q float64) { l.measure(d, quantiles{hedge: q}) }

// measure counts one attempt's latency. The goroutine that counts the last
// of latencyWindow samples makes the estimates anew. It then turns the
// generations. Before the first turn, first estimates of the hedge delay
// and of failFastQuantile are made at a few smaller counts. A high quantile
// of few samples is near their largest: it makes a late hedge, never an
// early one. The timeout is estimated only from a full window.
func (l *latency) measure(d time.Duration, qs quantiles) {
	g := l.gen.Load() & 1
	l.counts[g][bucket(d)].Add(1)
	if qs.timeout > 0 {
		l.since.Add(1)
	}
	l.count(qs)
}

// count counts a sample just added to the generation being filled.
func (l *latency) count(qs quantiles) {
	switch n := l.n.Add(1); {
	case n == latencyWindow:
		l.estimateFrom(qs)
		g := l.gen.Load() & 1
		old := g ^ 1 // emptied, then filled from now on
		for b := range l.counts[old] {
			l.counts[old][b].Store(0)
		}
		l.cuts[old].Store(0)
		l.gen.Store(old)
		l.n.Store(0)
		l.turned.Store(true)
		l.fresh.Add(1)
	case !l.turned.Load() && (n == 20 || n == 50 || n == 100 || n == 200):
		l.estimateFrom(qs)
	}
}

// cut counts an attempt that the measured timeout at cut short: censored,
// its latency unknown and at least at. A cut under a timeout shorter than
// the current one tells nothing more and is not counted.
//
// Say censorAlarm attempts, and more than censorAlarm times the share 1-q
// of the attempts, were cut since the last estimate. Then the quantile is
// above the timeout, by more than chance. The timeout doubles, to the
// ceiling at most, and the window is emptied. Latencies measured under the
// old timeout, all shorter than it, would lower it again. The window fills
// anew under the new timeout, which only rises meanwhile.
func (l *latency) cut(at time.Duration, qs quantiles) {
	cur := time.Duration(l.timeout.Load())
	if at < cur {
		return // an older, shorter timeout's
	}
	g := l.gen.Load() & 1
	l.cuts[g].Add(1)
	n, c := l.since.Add(1), l.cutSince.Add(1)
	if cur > 0 && cur < qs.ceiling && c >= censorAlarm && float64(c) > censorAlarm*(1-qs.timeout)*float64(n) {
		if l.timeout.CompareAndSwap(int64(cur), int64(double(cur, qs.ceiling))) {
			l.empty()
			return
		}
	}
	l.count(qs)
}

// attempt counts an attempt that took d. One that a timeout of cut ended
// (cut > 0) counts by whose timeout it was. A measured timeout's cut is
// censored. The request's own timeout tells nothing of the dependency. A
// fixed timeout's cut counts as that long.
func (l *latency) attempt(d, cut time.Duration, measuredTimeout, ownTimeout bool, qs quantiles) {
	switch {
	case cut == 0:
		l.measure(d, qs)
	case measuredTimeout:
		l.cut(cut, qs)
	case !ownTimeout:
		l.measure(d, qs)
	}
}

// empty starts the window afresh, after a raise of the timeout.
func (l *latency) empty() {
	for g := range l.counts {
		for b := range l.counts[g] {
			l.counts[g][b].Store(0)
		}
		l.cuts[g].Store(0)
	}
	l.n.Store(0)
	l.fresh.Store(0)
	l.since.Store(0)
	l.cutSince.Store(0)
}

// estimateFrom makes the estimates from both generations: the hedge
// quantile, failFastQuantile and, from a full window, the timeout.
func (l *latency) estimateFrom(qs quantiles) {
	var total uint64
	var sum [latencyBuckets]uint64
	for b := range sum {
		sum[b] = uint64(l.counts[0][b].Load()) + uint64(l.counts[1][b].Load())
		total += sum[b]
	}
	if qs.hedge > 0 {
		if b, ok := rank(&sum, qs.hedge, total); ok {
			l.est.Store(int64(top(b)))
		}
	}
	if b, ok := rank(&sum, failFastQuantile, total); ok && b > 0 {
		// The bucket's bottom: the quantile is no shorter. Its top would
		// refuse attempts that all end in time.
		l.low.Store(int64(top(b - 1)))
	}
	if qs.timeout > 0 && qs.ceiling > 0 && l.fresh.Load() >= 1 {
		// The cut attempts rank above every latency measured: when more
		// than 1-q of the window was cut, the quantile is not known, and
		// the timeout goes up one bucket (doubles past the last one).
		cuts := uint64(l.cuts[0].Load()) + uint64(l.cuts[1].Load())
		next := time.Duration(l.timeout.Load())
		if b, ok := rank(&sum, qs.timeout, total+cuts); ok {
			// Two buckets high: a window knows a high quantile from its
			// few slowest attempts, and noise should err long.
			next = top(b + 2)
		} else if next > 0 {
			next = up(next, qs.ceiling)
		}
		if next > 0 {
			l.timeout.Store(int64(min(max(next, minAttemptTimeout), qs.ceiling)))
		}
	}
	if qs.timeout > 0 {
		l.since.Store(0)
		l.cutSince.Store(0)
	}
}

// up returns the timeout one bucket above d: the top of d's bucket, or,
// past the last bucket's top, d doubled. It is never above ceiling.
func up(d, ceiling time.Duration) time.Duration {
	if next := top(bucket(d)); next > d {
		return min(next, ceiling)
	}
	return double(d, ceiling)
}

// double returns 2d, or ceiling if that is less: never an overflow.
func double(d, ceiling time.Duration) time.Duration {
	if d > ceiling/2 {
		return ceiling
	}
	return 2 * d
}

// rank returns the bucket of quantile q among total samples, of which sum
// holds those measured, and reports false when the quantile lies beyond
// them (among the cut ones) or there are none.
func rank(sum *[latencyBuckets]uint64, q float64, total uint64) (int, bool) {
	if total == 0 {
		return 0, false
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for b, c := range sum {
		if seen += c; seen >= want {
			return b, true
		}
	}
	return 0, false
}

// estimate returns the hedge quantile of the last estimate, or 0 before
// the first.
func (l *latency) estimate() time.Duration { return time.Duration(l.est.Load()) }

// least returns the bottom of failFastQuantile's bucket at the last
// estimate, or 0 before the first: the quantile is no shorter.
func (l *latency) least() time.Duration { return time.Duration(l.low.Load()) }

// attemptTimeout returns the measured attempt timeout, or 0 before it forms.
func (l *latency) attemptTimeout() time.Duration { return time.Duration(l.timeout.Load()) }
