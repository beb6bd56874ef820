// Package ratio is the ratio budget: retries as a share of recent
// requests. retryhttp.NewRatioBudget is its public face. The herd model
// (internal/herd) drives the same code on a simulated clock.
package ratio

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// The defaults of a Budget's zero fields.
const (
	// DefaultRatio lets retries be at most 10% of requests, the Google SRE
	// book's per-client retry budget ("Handling Overload").
	DefaultRatio = 0.1
	// DefaultPerSecond lets a quiet client retry this often, as Finagle's
	// RetryBudget does (Linkerd and tower have the same knob).
	DefaultPerSecond = 10
	// DefaultWindow is how long a request counts (Finagle's deposits live
	// 10 s).
	DefaultWindow = 10 * time.Second
)

// slotCount is the number of time slots the window is cut into. A request
// counts for between window·(1-1/slotCount) and window after it was made.
const slotCount = 10

// Budget lets retries be at most a share of recent requests, plus an
// allowance for quiet clients (retryhttp.NewRatioBudget). Each time slot
// holds its count beside the full number of its slot, so that a slot left
// behind, however long ago, never counts again. Its fields must be set
// before first use; zero fields mean the defaults.
type Budget struct {
	Ratio     float64          // the share of requests; see share
	PerSecond float64          // the allowance a second; see perSecond
	Window    time.Duration    // how long a request counts; see window
	Now       func() time.Time // nil means time.Now; simulations set a clock

	start    sync.Once
	origin   time.Time     // the clock's first reading
	last     atomic.Uint64 // the highest slot number read so far
	requests slots
	retries  slots
}

func (b *Budget) share() float64 { return orDefaultRate(b.Ratio, DefaultRatio) }

func (b *Budget) perSecond() float64 {
	return orDefaultRate(b.PerSecond, DefaultPerSecond)
}

// orDefaultRate reads a Budget field: zero, NaN or infinity means def,
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

func (b *Budget) window() time.Duration {
	w := b.Window
	if w <= 0 {
		w = DefaultWindow
	}
	return max(w, minWindow)
}

// minWindow is the shortest window: its slots are a tenth of a
// millisecond.
const minWindow = time.Millisecond

// epoch returns the number of the current slot since the clock's first
// reading, 1 or more (0 marks a slot never used). It never goes back: the
// slots are counted on time.Now's monotonic clock, and a clock that steps
// back all the same (a clock without one, the wall clock's) holds the slot
// where it was until it passes it again, so that old events never count as
// new ones, nor new ones as expired.
func (b *Budget) epoch() uint64 {
	now := time.Now
	if b.Now != nil {
		now = b.Now
	}
	t := now()
	b.start.Do(func() { b.origin = t })
	e := uint64(max(t.Sub(b.origin), 0)/(b.window()/slotCount)) + 1 // never reusing
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

// slots count events in the last slotCount time slots. Slot i holds the
// count of the slot numbered epoch[i], one of those numbered i modulo
// slotCount. A slot is reused for a new number by the first event of that
// number: it is marked busy (reusing), its count set, then its number
// published, so that no event of the new number is counted in the old one
// and none of the old is counted in the new. An event whose number is older
// than the slot's (its goroutine was delayed past the slot's reuse) is
// counted in the newer slot rather than resetting it.
type slots struct {
	epoch [slotCount]atomic.Uint64
	count [slotCount]atomic.Int64
}

// reusing marks a slot being reused.
const reusing = math.MaxUint64

// add counts one event of slot number e, and returns the number of the
// slot it was counted in: e, or a newer one that has reused e's.
func (s *slots) add(e uint64) uint64 {
	i := e % slotCount
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
	i := e % slotCount
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
	for i := range slotCount {
		if se := s.epoch[i].Load(); se != reusing && se <= e && e-se < slotCount {
			total += s.count[i].Load()
		}
	}
	return total
}

// current returns the events of slot number e.
func (s *slots) current(e uint64) int64 {
	i := e % slotCount
	if s.epoch[i].Load() != e {
		return 0
	}
	return s.count[i].Load()
}

// allowed reports how many retries the window allows now, and how many it
// holds.
func (b *Budget) allowed(e uint64) (allow, made float64) {
	requests := float64(b.requests.sum(e))
	allow = b.share()*requests + b.perSecond()*b.window().Seconds()
	return allow, float64(b.retries.sum(e))
}

// Deposit counts a request, whatever its outcome.
func (b *Budget) Deposit() { b.requests.add(b.epoch()) }

// Withdraw allows a retry while the window holds fewer retries than it
// allows, and counts it in the returned slot. One time slot may hold at
// most twice its share of the allowance, so that it is spread over the
// window.
func (b *Budget) Withdraw() (slot uint64, ok bool) {
	e := b.epoch()
	allow, made := b.allowed(e)
	if made+1 > allow {
		return 0, false
	}
	perSlot := max(1, math.Ceil(2*allow/slotCount))
	if float64(b.retries.current(e))+1 > perSlot {
		return 0, false
	}
	return b.retries.add(e), true
}

// Refund gives back a retry that was never sent to the slot that counted
// it. A retry whose slot has left the window has nothing to give back.
func (b *Budget) Refund(slot uint64) { b.retries.remove(slot) }

// Available reports how many more retries the window allows now.
func (b *Budget) Available() int {
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
