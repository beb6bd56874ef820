package retryhttp

import (
	"math"
	"sync/atomic"
	"time"
)

// Defaults of a RatioBudget, where its fields are zero.
const (
	// DefaultRetryRatio lets retries be at most 10% of requests, the Google
	// SRE book's per-client retry budget ("Handling Overload": worst-case
	// load about 1.1x instead of nearly 3x with three attempts).
	DefaultRetryRatio = 0.1
	// DefaultMinRetriesPerSecond lets a client with little traffic still
	// retry this many times a second, as Finagle's default RetryBudget does
	// (10 a second; Linkerd and tower use the same knob).
	DefaultMinRetriesPerSecond = 10
	// DefaultRatioWindow is how long a request counts towards the ratio
	// (Finagle's deposits live 10 s).
	DefaultRatioWindow = 10 * time.Second
)

// ratioSlots is the number of time slots the window is cut into: a request
// counts for between Window·(1-1/ratioSlots) and Window after it was made,
// depending on where in its slot it fell.
const ratioSlots = 10

// A RatioBudget lets retries be at most a share of recent requests, plus a
// small allowance for quiet clients: the budget of the Google SRE book (a
// client retries only while its retries are under 10% of its requests) and
// of Finagle, Linkerd and tower (a percentage of requests plus a minimum of
// retries a second, deposits expiring after a window).
//
// Over any Window, it allows Ratio·requests + MinPerSecond·Window retries,
// spread over the window: a tenth of it may hold at most twice its share,
// so retries never come back in one burst when old ones expire.
// Unlike the token bucket, it does not care whether requests succeed: during
// an outage a client keeps making requests, and keeps the right to retry a
// tenth of them, so the load on the dependency is bounded at about
// (1 + Ratio) times the requests, whatever happens, and the budget recovers
// by itself as old requests leave the window.
//
// Its fields must be set before first use; the zero RatioBudget is ready to
// use with the defaults. It is safe for concurrent use and lock-free: each
// time slot holds its counts in atomic words tagged with the slot's epoch.
// Two retries withdrawn at the same instant may both pass the check for the
// last allowed retry (one over, at most once per concurrent caller).
type RatioBudget struct {
	// Ratio is the share of requests that may be retried. Zero means
	// DefaultRetryRatio; a negative value allows no retry beyond
	// MinPerSecond.
	Ratio float64
	// MinPerSecond is how many retries a second are allowed whatever the
	// traffic. Zero means DefaultMinRetriesPerSecond; a negative value
	// means none.
	MinPerSecond float64
	// Window is how long a request, and a retry, counts. Zero means
	// DefaultRatioWindow.
	Window time.Duration
	// Now returns the current time; nil means time.Now (which a
	// testing/synctest bubble makes fake).
	Now func() time.Time

	requests [ratioSlots]atomic.Uint64 // epoch<<countBits | count
	retries  [ratioSlots]atomic.Uint64
}

const (
	countBits = 40
	countMask = 1<<countBits - 1
)

var _ RetryBudget = (*RatioBudget)(nil)

func (b *RatioBudget) ratio() float64 { return orDefaultRate(b.Ratio, DefaultRetryRatio) }

func (b *RatioBudget) minPerSecond() float64 {
	return orDefaultRate(b.MinPerSecond, DefaultMinRetriesPerSecond)
}

// orDefaultRate reads a RatioBudget field: zero means def, negative none.
func orDefaultRate(v, def float64) float64 {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return def
	}
	return v
}

func (b *RatioBudget) window() time.Duration { return orDefault(b.Window, DefaultRatioWindow) }

// epoch returns the number of the current slot since the Unix epoch.
func (b *RatioBudget) epoch() uint64 {
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}
	slot := b.window() / ratioSlots
	if slot <= 0 {
		slot = 1
	}
	return uint64(now().UnixNano() / int64(slot))
}

// add counts one in the current slot of counts.
func add(counts *[ratioSlots]atomic.Uint64, epoch uint64) {
	c := &counts[epoch%ratioSlots]
	for {
		old := c.Load()
		next := epoch<<countBits | 1
		if old>>countBits == epoch&(1<<(64-countBits)-1) {
			next = old + 1
		}
		if c.CompareAndSwap(old, next) {
			return
		}
	}
}

// sum returns the counts of the slots that are still in the window.
func sum(counts *[ratioSlots]atomic.Uint64, epoch uint64) uint64 {
	var total uint64
	const epochMask = 1<<(64-countBits) - 1
	for i := range counts {
		v := counts[i].Load()
		e := v >> countBits
		// A slot counts if its epoch is one of the last ratioSlots.
		if age := (epoch - e) & epochMask; age < ratioSlots {
			total += v & countMask
		}
	}
	return total
}

// allowed reports how many retries the window allows now, and how many it
// holds.
func (b *RatioBudget) allowed(epoch uint64) (allow, made float64) {
	requests := float64(sum(&b.requests, epoch))
	allow = b.ratio()*requests + b.minPerSecond()*b.window().Seconds()
	return allow, float64(sum(&b.retries, epoch))
}

// Deposit counts a request, whatever its outcome.
func (b *RatioBudget) Deposit(bool) { add(&b.requests, b.epoch()) }

// Withdraw allows a retry while the retries in the window are fewer than
// the window allows, and counts it. A retry costs 1, whatever its class. So
// that the allowance is spread over the window rather than spent in one
// burst whenever old retries expire, one time slot (a tenth of the window)
// may hold at most twice its share of it.
func (b *RatioBudget) Withdraw(Class) (int64, bool) {
	e := b.epoch()
	allow, made := b.allowed(e)
	if made+1 > allow {
		return 0, false
	}
	perSlot := max(1, math.Ceil(2*allow/ratioSlots))
	if float64(sum1(&b.retries, e))+1 > perSlot {
		return 0, false
	}
	add(&b.retries, e)
	return 1, true
}

// sum1 returns the count of the current slot.
func sum1(counts *[ratioSlots]atomic.Uint64, epoch uint64) uint64 {
	v := counts[epoch%ratioSlots].Load()
	if v>>countBits != epoch&(1<<(64-countBits)-1) {
		return 0
	}
	return v & countMask
}

// Refund gives back a retry that was never sent; one that was sent stays
// counted, successful or not, since it was load on the dependency.
func (b *RatioBudget) Refund(cost int64, sent bool) {
	if sent || cost <= 0 {
		return
	}
	e := b.epoch()
	c := &b.retries[e%ratioSlots]
	for {
		old := c.Load()
		if old>>countBits != e&(1<<(64-countBits)-1) || old&countMask == 0 {
			return // counted in an older slot: it will expire with it
		}
		if c.CompareAndSwap(old, old-1) {
			return
		}
	}
}

// Available reports how many more retries the window allows now.
func (b *RatioBudget) Available() int {
	allow, made := b.allowed(b.epoch())
	return int(math.Max(0, math.Floor(allow-made)))
}
