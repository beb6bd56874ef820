package retryhttp

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp/internal/ratio"
	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// drain withdraws until the budget refuses and returns how many it allowed.
func drain(b Budget) int {
	n := 0
	for {
		if _, ok := b.Withdraw(ctxBG, Transient); !ok {
			return n
		}
		n++
	}
}

// drainFor drains once a second for the given seconds, and returns the
// total allowed.
func drainFor(b Budget, seconds int) int {
	n := 0
	for range seconds {
		n += drain(b)
		time.Sleep(time.Second)
	}
	return n
}

func TestRatioBudget(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T) (got, want int)
	}{
		{"1,000 requests, then an outage: 10% of them over the window", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{PerSecond: -1}}
			for range 1000 {
				b.Deposit(false)
			}
			return drainFor(b, 10), 100
		}},
		{"no burst: at most twice a slot's share at once", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{PerSecond: -1}}
			for range 1000 {
				b.Deposit(false)
			}
			return drain(b), 20
		}},
		{"quiet client: the minimum per second, sustained", func(t *testing.T) (int, int) {
			b := &ratioBudget{} // 10% and 10 a second over 10 s
			return drainFor(b, 60), 600
		}},
		{"low traffic: the ratio and the minimum add up", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{PerSecond: 1}} // 10% plus 1 a second
			for range 300 {
				b.Deposit(true)
			}
			return drainFor(b, 9), 40 // 0.1·300 + 1·10, all inside the window
		}},
		{"a custom ratio and window", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{Ratio: 0.2, PerSecond: 1, Window: 5 * time.Second}}
			for range 200 {
				b.Deposit(false)
			}
			return drain(b), 9 // 2·(0.2·200 + 1·5)/10 at once
		}},
		{"deposits expire after the window", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{PerSecond: -1}}
			for range 1000 {
				b.Deposit(true)
			}
			time.Sleep(10 * time.Second)
			return drain(b), 0
		}},
		{"deposits still count just inside the window", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{PerSecond: -1}}
			for range 1000 {
				b.Deposit(true)
			}
			time.Sleep(9*time.Second + 999*time.Millisecond)
			return drain(b), 20
		}},
		{"retries expire too: the budget recovers", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{PerSecond: -1}}
			for range 1000 {
				b.Deposit(false)
			}
			drainFor(b, 10)
			time.Sleep(10 * time.Second) // the old requests and retries expire
			for range 500 {
				b.Deposit(false)
			}
			return drain(b), 10 // 2·0.1·500/10
		}},
		{"an unsent retry is refunded, a sent one is not", func(t *testing.T) (int, int) {
			b := &ratioBudget{ratio.Budget{PerSecond: -1}}
			for range 200 {
				b.Deposit(false)
			}
			c1, _ := b.Withdraw(ctxBG, Transient)
			c2, _ := b.Withdraw(ctxBG, Throttling)
			c1(false)          // never sent
			c2(true)           // succeeded: it was load all the same
			return drain(b), 3 // 4 a slot, one still counted
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				if got, want := tc.run(t); got != want {
					t.Errorf("got %d retries allowed; want %d", got, want)
				}
			})
		})
	}
}

func TestRatioBudgetAvailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &ratioBudget{ratio.Budget{PerSecond: -1}}
		for range 1000 {
			b.Deposit(false)
		}
		b.Withdraw(ctxBG, Transient)
		if got := b.Available(); got != 99 {
			t.Errorf("got %d available; want 99 (over the window)", got)
		}
	})
}

func TestRatioBudgetUnderContention(t *testing.T) {
	// 50 goroutines deposit 100 requests each, then all withdraw at once:
	// every deposit is counted, and the retries allowed at once are a
	// slot's cap of the 500 (100), give or take one per concurrent
	// withdrawer.
	synctest.Test(t, func(t *testing.T) {
		b := &ratioBudget{ratio.Budget{PerSecond: -1}}
		var wg sync.WaitGroup
		for range 50 {
			wg.Go(func() {
				for range 100 {
					b.Deposit(false)
				}
			})
		}
		wg.Wait()
		var mu sync.Mutex
		allowed := 0
		for range 50 {
			wg.Go(func() {
				n := drain(b)
				mu.Lock()
				allowed += n
				mu.Unlock()
			})
		}
		wg.Wait()
		if allowed < 100 || allowed > 150 {
			t.Errorf("got %d retries allowed at once for 5,000 requests; want 100 (at most one over per withdrawer)", allowed)
		}
	})
}

func TestRatioBudgetThroughTheTransport(t *testing.T) {
	// A server that is down for 60 s, 100 requests a second, 3 attempts
	// each: in the last 50 s, once the window is full, a retry for one
	// request in ten, 1.1 attempts a request, as the SRE book says.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(503))
		tr := &Transport{Base: base, Budget: &ratioBudget{ratio.Budget{PerSecond: -1}}, Policy: Policy{Rand: lowRand}}
		var after10 int
		for i := range 6000 {
			if i == 1000 {
				after10 = len(base.Attempts())
			}
			roundTrip(t, tr, newReq(t, "GET", ""))
			time.Sleep(10 * time.Millisecond)
		}
		if got := len(base.Attempts()) - after10; got != 5500 {
			t.Errorf("got %d attempts for the last 5,000 requests; want 5,500", got)
		}
	})
}

func TestNilPointerBudget(t *testing.T) {
	// A nil pointer in the interface field means the default, not a panic.
	synctest.Test(t, func(t *testing.T) {
		var b *tokenBucket
		tr := &Transport{Base: rht.NewTransport(rht.Status(503), rht.Status(200)), Budget: b}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200 after a retry", code, err)
		}
		if got := tr.budgetInUse().Available(); got != DefaultBudgetTokens {
			t.Errorf("got %d tokens; want %d (a private default bucket, refunded)", got, DefaultBudgetTokens)
		}
	})
}

// clock is a settable time for a RatioBudget's Now.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

func TestRatioBudgetNonFiniteSettings(t *testing.T) {
	// NaN and infinite settings mean the defaults: as many retries as the
	// zero RatioBudget allows, never all of them.
	nan, inf := math.NaN(), math.Inf(1)
	for _, b := range []*ratioBudget{
		{ratio.Budget{Ratio: nan}}, {ratio.Budget{Ratio: inf}}, {ratio.Budget{Ratio: -inf}},
		{ratio.Budget{PerSecond: nan}}, {ratio.Budget{PerSecond: inf}}, {ratio.Budget{PerSecond: -inf}},
	} {
		t.Run(fmt.Sprintf("Ratio %v MinPerSecond %v", b.Ratio, b.PerSecond), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var zero ratioBudget
				for range 100 {
					b.Deposit(true)
					zero.Deposit(true)
				}
				if b.Ratio == -inf || b.PerSecond == -inf {
					return // negative: none, as documented
				}
				if got, want := b.Available(), zero.Available(); got != want {
					t.Errorf("got %d available; want %d, the zero RatioBudget's", got, want)
				}
				if got, want := drain(b), drain(&zero); got != want {
					t.Errorf("got %d retries allowed; want %d", got, want)
				}
			})
		})
	}
}

func TestRatioBudgetOldSlotsNeverComeBack(t *testing.T) {
	// Retries made long ago, exactly 2^24 slots (the span of a 24-bit slot
	// number) or 2^40 slots before now, do not count: only slots within
	// the window do.
	for _, ago := range []int64{1 << 24, 1 << 40} {
		t.Run(fmt.Sprintf("%d slots ago", ago), func(t *testing.T) {
			c := &clock{time.Unix(1_800_000_000, 0)}
			b := &ratioBudget{ratio.Budget{PerSecond: -1, Window: 10 * time.Millisecond, Now: c.Now}}
			for range 1000 {
				b.Deposit(true)
			}
			spent := drain(b)
			c.now = c.now.Add(time.Duration(ago) * time.Millisecond) // a slot is 1 ms
			if got := b.Available(); got != 0 {
				t.Errorf("got %d available; want 0 (no request in the window)", got)
			}
			for range 1000 {
				b.Deposit(true)
			}
			if got := drain(b); got != spent {
				t.Errorf("got %d retries allowed; want %d, as many as the first time", got, spent)
			}
		})
	}
}

func TestRatioBudgetClockSteppedBack(t *testing.T) {
	// A wall clock stepped back a minute (an NTP step, a VM restored) by a
	// Now without a monotonic reading: the window holds where it was, and
	// allows no more than the window's allowance, until the clock passes it
	// again.
	c := &clock{time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)}
	b := &ratioBudget{ratio.Budget{Now: c.Now}} // 10%, 10 a second over 10 s
	for range 100 {
		b.Deposit(true)
	}
	first := drain(b)
	c.now = c.now.Add(-time.Minute)
	for range 10000 {
		b.Deposit(true)
	}
	got := 0
	for range 20000 { // bounded: a budget that fails open never refuses
		if _, ok := b.Withdraw(ctxBG, Transient); ok {
			got++
		}
	}
	if most := 10100/10 + 100; got > most {
		t.Errorf("after the step: got %d retries for 10,100 requests; want at most %d, the window's allowance", got, most)
	}
	c.now = c.now.Add(time.Minute + 11*time.Second) // past the old window
	for range 100 {
		b.Deposit(true)
	}
	if got := drain(b); got != first {
		t.Errorf("once the clock has passed the window again: got %d retries; want %d, as at first", got, first)
	}
}

func TestRatioBudgetDelayedCallerKeepsNewerSlot(t *testing.T) {
	// A caller that read the clock a whole window ago and counts only now
	// must not reset the slot a newer count has taken over.
	c := &clock{time.Unix(1_800_000_000, 0)}
	b := &ratioBudget{ratio.Budget{PerSecond: -1, Now: c.Now}}
	for range 100 {
		b.Deposit(true)
	}
	c.now = c.now.Add(-ratio.DefaultWindow) // the delayed caller's clock
	b.Deposit(true)
	c.now = c.now.Add(ratio.DefaultWindow)
	if got := b.Available(); got != 10 {
		t.Errorf("got %d available; want 10 (101 requests in the window)", got)
	}
}

func TestRatioBudgetRefundGoesToItsSlot(t *testing.T) {
	// A retry counted in one slot and refunded in the next gives its count
	// back to the slot that counted it.
	c := &clock{time.Unix(1_800_000_000, 0)}
	b := &ratioBudget{ratio.Budget{PerSecond: -1, Now: c.Now}}
	for range 1000 {
		b.Deposit(true)
	}
	tk, ok := b.Withdraw(ctxBG, Transient)
	if !ok {
		t.Fatal("the retry was refused")
	}
	before := b.Available()
	c.now = c.now.Add(time.Second) // the next slot
	tk(false)
	if got := b.Available(); got != before+1 {
		t.Errorf("got %d available after the refund; want %d", got, before+1)
	}
}

// A retry whose caller read the clock a window ago is counted in the newer
// slot, and its refund goes to that slot.
func TestRatioBudgetDelayedWithdrawRefundsItsSlot(t *testing.T) {
	c := &clock{time.Unix(1_800_000_000, 0)}
	b := &ratioBudget{ratio.Budget{Now: c.Now}}
	for range 1000 {
		b.Deposit(true)
	}
	if _, ok := b.Withdraw(ctxBG, Transient); !ok { // a retry now: its slot holds the current number
		t.Fatal("the first retry was refused")
	}
	c.now = c.now.Add(-ratio.DefaultWindow) // the delayed caller's clock
	tk, ok := b.Withdraw(ctxBG, Transient)
	c.now = c.now.Add(ratio.DefaultWindow)
	if !ok {
		t.Fatal("the delayed retry was refused")
	}
	before := b.Available()
	tk(false) // never sent
	if got := b.Available(); got != before+1 {
		t.Errorf("got %d available after refunding the delayed retry; want %d (it was counted in the current slot)", got, before+1)
	}
}

// An allowance past MaxInt (a MinPerSecond or Ratio meaning no limit) is
// MaxInt retries left: int of such a float is undefined (MinInt64 on
// amd64).
func TestRatioBudgetAvailableHuge(t *testing.T) {
	for _, b := range []*ratioBudget{{ratio.Budget{PerSecond: 1e300}}, {ratio.Budget{PerSecond: math.MaxFloat64}}, {ratio.Budget{Ratio: math.MaxFloat64}}} {
		b.Deposit(true)
		if got := b.Available(); got != math.MaxInt {
			t.Errorf("ratioBudget{Ratio: %v, PerSecond: %v}.Available() = %d; want MaxInt", b.Ratio, b.PerSecond, got)
		}
	}
}

// RatioBudget.Available at the edges: a ratio that overflows the allowance
// to +Inf saturates at MaxInt; an empty window is MinPerSecond·Window.
func TestRatioBudgetAvailableEdges(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := &ratioBudget{ratio.Budget{Ratio: math.MaxFloat64, PerSecond: -1}}
		if got := b.Available(); got != 0 {
			t.Errorf("no requests: got %d; want 0", got)
		}
		b.Deposit(true)
		b.Deposit(true)
		if got := b.Available(); got != math.MaxInt {
			t.Errorf("an infinite allowance: got %d; want MaxInt", got)
		}
		if _, ok := b.Withdraw(ctxBG, Transient); !ok {
			t.Error("an infinite allowance refused a retry")
		}
		b2 := &ratioBudget{ratio.Budget{PerSecond: math.MaxFloat64, Window: time.Duration(math.MaxInt64)}}
		if got := b2.Available(); got != math.MaxInt {
			t.Errorf("a huge perSecond: got %d; want MaxInt", got)
		}
	})
}
