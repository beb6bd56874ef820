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

// latency keeps a running quantile of attempt latencies, for an automatic
// hedge delay. It counts them in buckets, latencySubBuckets to a doubling.
// It keeps two generations of latencyWindow samples. The newer one is
// filled while both are read. The estimate is made again at each turn of
// generations. So it follows the last latencyWindow to twice as many
// attempts. It is lock-free: a sample counted as a generation turns may
// land in the wrong one. The zero latency is ready to use.
type latency struct {
	counts [2][latencyBuckets]atomic.Uint32
	gen    atomic.Uint32 // the generation being filled
	n      atomic.Int64  // samples in it
	est    atomic.Int64  // the quantile at the last estimate, in ns; 0 before
	turned atomic.Bool   // a generation has turned
}

const (
	latencyWindow     = 500
	latencySubBuckets = 4                        // per doubling
	latencyMin        = 10 * time.Microsecond    // the first bucket's top
	latencyBuckets    = 24*latencySubBuckets + 1 // bucket 0, then 24 doublings above latencyMin
)

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

// record counts one attempt's latency. The goroutine that counts the last
// of latencyWindow samples makes the estimate of quantile q anew. It then
// turns the generations. Before the first turn, a first estimate is made
// at a few smaller counts. A high quantile of few samples is near their
// largest: it makes a late hedge, never an early one.
func (l *latency) record(d time.Duration, q float64) {
	g := l.gen.Load() & 1
	l.counts[g][bucket(d)].Add(1)
	switch n := l.n.Add(1); {
	case n == latencyWindow:
		l.estimateFrom(q)
		old := g ^ 1 // emptied, then filled from now on
		for b := range l.counts[old] {
			l.counts[old][b].Store(0)
		}
		l.gen.Store(old)
		l.n.Store(0)
		l.turned.Store(true)
	case !l.turned.Load() && (n == 20 || n == 50 || n == 100 || n == 200):
		l.estimateFrom(q)
	}
}

// estimateFrom makes the estimate of quantile q from both generations.
func (l *latency) estimateFrom(q float64) {
	var total uint64
	var sum [latencyBuckets]uint64
	for b := range sum {
		sum[b] = uint64(l.counts[0][b].Load()) + uint64(l.counts[1][b].Load())
		total += sum[b]
	}
	want := uint64(math.Ceil(q * float64(total)))
	var seen uint64
	for b, c := range sum {
		if seen += c; seen >= want {
			l.est.Store(int64(top(b)))
			return
		}
	}
}

// estimate returns the last estimate of the quantile, or 0 before the
// first one.
func (l *latency) estimate() time.Duration { return time.Duration(l.est.Load()) }
