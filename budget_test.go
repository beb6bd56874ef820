package retryhttp

import (
	"math"
	"sync"
	"sync/atomic"
	"testing"
)

func TestBudgetTakeAndGive(t *testing.T) {
	b := NewBudget(30)
	steps := []struct {
		op   string
		n    int64
		ok   bool
		want int
	}{
		{"take", 14, true, 16},
		{"take", 14, true, 2},
		{"take", 5, false, 2},
		{"give", 14, true, 16},
		{"give", 100, true, 30},
		{"take", 30, true, 0},
		{"take", 1, false, 0},
	}
	for i, s := range steps {
		ok := true
		if s.op == "take" {
			ok = b.take(s.n)
		} else {
			b.give(s.n)
		}
		if ok != s.ok || b.Available() != s.want {
			t.Errorf("step %d (%s %d): got (%v, %d); want (%v, %d)", i, s.op, s.n, ok, b.Available(), s.ok, s.want)
		}
	}
}

func TestBudgetEdges(t *testing.T) {
	if got := NewBudget(-3).Capacity(); got != 0 {
		t.Errorf("NewBudget(-3): got capacity %d; want 0", got)
	}
	var zero Budget
	if zero.take(1) {
		t.Error("the zero Budget paid for a retry; want refusal")
	}
	u := UnlimitedBudget()
	for range 1000 {
		if !u.take(RetryCost) {
			t.Fatal("UnlimitedBudget refused a retry")
		}
	}
	if u.Available() != math.MaxInt {
		t.Errorf("UnlimitedBudget: got %d available; want math.MaxInt", u.Available())
	}
}

func TestBudgetConcurrent(t *testing.T) {
	b := NewBudget(500)
	var wg sync.WaitGroup
	var paid atomic.Int64

	// 64 goroutines race to pay for retries: exactly floor(500/14) = 35 win.
	for range 64 {
		wg.Go(func() {
			for b.take(RetryCost) {
				paid.Add(1)
			}
		})
	}
	wg.Wait()
	if got := paid.Load(); got != 35 {
		t.Errorf("got %d retries paid; want 35", got)
	}
	if got := b.Available(); got != 500-35*RetryCost {
		t.Errorf("got %d tokens; want %d", got, 500-35*RetryCost)
	}

	// 1,000 concurrent rewards fill it exactly to capacity, not beyond.
	for range 1000 {
		wg.Go(func() { b.give(SuccessReward) })
	}
	wg.Wait()
	if got := b.Available(); got != 500 {
		t.Errorf("got %d tokens; want 500", got)
	}

	// Mixed traffic never leaves [0, capacity].
	for g := range 64 {
		wg.Go(func() {
			for i := range 2000 {
				if (g+i)%3 == 0 {
					b.give(SuccessReward)
				} else if b.take(RetryCost) && i%2 == 0 {
					b.give(RetryCost) // a refunded retry
				}
				if a := b.Available(); a < 0 || a > 500 {
					t.Errorf("got %d tokens; want within [0, 500]", a)
					return
				}
			}
		})
	}
	wg.Wait()
}
