package retryhttp

import (
	"math"
	"runtime"
	"sync"
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
// time slot holds its count beside the full number of its slot, so a slot
// left behind, however long ago, never counts again. Two retries withdrawn
// at the same instant may both pass the check for the last allowed retry
// (one over, at most once per concurrent caller), and a request counted at
// the very moment its slot is reused for a new one may be lost.
type RatioBudget struct {
	// Ratio is the share of requests that may be retried. Zero, NaN or
	// infinity means DefaultRetryRatio; a negative value allows no retry
	// beyond MinPerSecond.
	Ratio float64
	// MinPerSecond is how many retries a second are allowed whatever the
	// traffic. Zero, NaN or infinity means DefaultMinRetriesPerSecond; a
	// negative value means none.
	MinPerSecond float64
	// Window is how long a request, and a retry, counts. Zero means
	// DefaultRatioWindow; a window shorter than a millisecond is taken as
	// one.
	Window time.Duration
	// Now returns the current time; nil means time.Now (which a
	// testing/synctest bubble makes fake).
	Now func() time.Time

	start    sync.Once
	origin   time.Time     // the clock's first reading
	last     atomic.Uint64 // the highest slot number read so far
	requests slots
	retries  slots
}

var (
	_ RetryBudget = (*RatioBudget)(nil)
	_ Payer       = (*RatioBudget)(nil)
)

func (b *RatioBudget) ratio() float64 { return orDefaultRate(b.Ratio, DefaultRetryRatio) }

func (b *RatioBudget) minPerSecond() float64 {
	return orDefaultRate(b.MinPerSecond, DefaultMinRetriesPerSecond)
}

// orDefaultRate reads a RatioBudget field: zero, NaN or infinity means def,
// negative none.
func orDefaultRate(v, def float64) float64 {
	switch {
	case v == 0 || math.IsNaN(v) || math.IsInf(v, 0):
		return def
	case v < 0:
		return 0
	}
	return v
}

func (b *RatioBudget) window() time.Duration {
	return max(orDefault(b.Window, DefaultRatioWindow), minRatioWindow)
}

// minRatioWindow is the shortest window: its slots are a tenth of a
// millisecond.
const minRatioWindow = time.Millisecond

// epoch returns the number of the current slot since the clock's first
// reading, 1 or more (0 marks a slot never used). It never goes back: the
// slots are counted on time.Now's monotonic clock, and a clock that steps
// back all the same (a Now without one, the wall clock's) holds the slot
// where it was until it passes it again, so that old events never count as
// new ones, nor new ones as expired.
func (b *RatioBudget) epoch() uint64 {
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}
	t := now()
	b.start.Do(func() { b.origin = t })
	e := uint64(max(t.Sub(b.origin), 0)/(b.window()/ratioSlots)) + 1 // never reusing
	for {
		last := b.last.Load()
		if e <= last {
			return last
		}
		if b.last.CompareAndSwap(last, e) {
			return e
		}
	}
}

// slots count events in the last ratioSlots time slots. Slot i holds the
// count of the slot numbered epoch[i], one of those numbered i modulo
// ratioSlots. A slot is reused for a new number by the first event of that
// number: it is marked busy (reusing), its count set, then its number
// published, so that no event of the new number is counted in the old one
// and none of the old is counted in the new. An event whose number is older
// than the slot's (its goroutine was delayed past the slot's reuse) is
// counted in the newer slot rather than resetting it.
type slots struct {
	epoch [ratioSlots]atomic.Uint64
	count [ratioSlots]atomic.Int64
}

// reusing marks a slot being reused.
const reusing = math.MaxUint64

// add counts one event of slot number e, and returns the number of the
// slot it was counted in: e, or a newer one that has reused e's.
func (s *slots) add(e uint64) uint64 {
	i := e % ratioSlots
	for {
		cur := s.epoch[i].Load()
		switch {
		case cur == reusing:
			runtime.Gosched() // another event is reusing the slot: a few instructions
		case cur >= e:
			s.count[i].Add(1) // this slot, or a newer one: never reset a newer slot
			return cur
		case s.epoch[i].CompareAndSwap(cur, reusing):
			s.count[i].Store(1)
			s.epoch[i].Store(e)
			return e
		}
	}
}

// remove takes back one event counted in slot number e, if the slot still
// holds that number: an event of a slot since reused has left the window.
func (s *slots) remove(e uint64) {
	i := e % ratioSlots
	for {
		n := s.count[i].Load()
		if s.epoch[i].Load() != e || n <= 0 {
			return
		}
		if s.count[i].CompareAndSwap(n, n-1) {
			return
		}
	}
}

// sum returns the events of the slots in the window that ends with slot
// number e.
func (s *slots) sum(e uint64) int64 {
	var total int64
	for i := range ratioSlots {
		if se := s.epoch[i].Load(); se != reusing && se <= e && e-se < ratioSlots {
			total += s.count[i].Load()
		}
	}
	return total
}

// current returns the events of slot number e.
func (s *slots) current(e uint64) int64 {
	i := e % ratioSlots
	if s.epoch[i].Load() != e {
		return 0
	}
	return s.count[i].Load()
}

// allowed reports how many retries the window allows now, and how many it
// holds.
func (b *RatioBudget) allowed(e uint64) (allow, made float64) {
	requests := float64(b.requests.sum(e))
	allow = b.ratio()*requests + b.minPerSecond()*b.window().Seconds()
	return allow, float64(b.retries.sum(e))
}

// Deposit counts a request, whatever its outcome.
func (b *RatioBudget) Deposit(bool) { b.requests.add(b.epoch()) }

// Withdraw allows a retry while the retries in the window are fewer than
// the window allows, and counts it. A retry costs 1, whatever its class. So
// that the allowance is spread over the window rather than spent in one
// burst whenever old retries expire, one time slot (a tenth of the window)
// may hold at most twice its share of it.
func (b *RatioBudget) Withdraw(Class) (Tokens, bool) {
	e := b.epoch()
	allow, made := b.allowed(e)
	if made+1 > allow {
		return Tokens{}, false
	}
	perSlot := max(1, math.Ceil(2*allow/ratioSlots))
	if float64(b.retries.current(e))+1 > perSlot {
		return Tokens{}, false
	}
	return Tokens{Cost: 1, Payer: b, Mark: b.retries.add(e)}, true
}

// Refund gives back a retry that was never sent, to the time slot that
// counted it; one that was sent stays counted, successful or not, since it
// was load on the dependency. A retry whose slot has left the window has
// nothing to give back.
func (b *RatioBudget) Refund(t Tokens, sent bool) {
	if sent || t.Cost <= 0 {
		return
	}
	b.retries.remove(t.Mark)
}

// Available reports how many more retries the window allows now.
func (b *RatioBudget) Available() int {
	allow, made := b.allowed(b.epoch())
	switch n := math.Floor(allow - made); {
	case !(n > 0): // NaN too
		return 0
	case n >= float64(math.MaxInt): // int(n) would be undefined
		return math.MaxInt
	default:
		return int(n)
	}
}
