package retryhttp

import (
	"sync"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// drain withdraws until the budget refuses and returns how many it allowed.
func drain(b RetryBudget) int {
	n := 0
	for {
		if _, ok := b.Withdraw(Transient); !ok {
			return n
		}
		n++
	}
}

func TestRatioBudget(t *testing.T) {
	tests := []struct {
		name string
		run  func(t *testing.T) (got, want int)
	}{
		{"1,000 requests, then an outage: 10% of them", func(t *testing.T) (int, int) {
			b := &RatioBudget{MinPerSecond: -1}
			for range 1000 {
				b.Deposit(false)
			}
			return drain(b), 100
		}},
		{"quiet client: the minimum per second over the window", func(t *testing.T) (int, int) {
			b := &RatioBudget{} // 10% and 10 a second over 10 s
			for range 5 {       // 5 requests in 5 seconds
				b.Deposit(true)
				time.Sleep(time.Second)
			}
			return drain(b), 100 // floor(0.1·5 + 10·10)
		}},
		{"a custom ratio and window", func(t *testing.T) (int, int) {
			b := &RatioBudget{Ratio: 0.2, MinPerSecond: 1, Window: 5 * time.Second}
			for range 200 {
				b.Deposit(false)
			}
			return drain(b), 45 // 0.2·200 + 1·5
		}},
		{"deposits expire after the window", func(t *testing.T) (int, int) {
			b := &RatioBudget{MinPerSecond: -1}
			for range 1000 {
				b.Deposit(true)
			}
			time.Sleep(10 * time.Second)
			return drain(b), 0
		}},
		{"deposits still count just inside the window", func(t *testing.T) (int, int) {
			b := &RatioBudget{MinPerSecond: -1}
			for range 1000 {
				b.Deposit(true)
			}
			time.Sleep(9*time.Second + 999*time.Millisecond)
			return drain(b), 100
		}},
		{"retries expire too: the budget recovers", func(t *testing.T) (int, int) {
			b := &RatioBudget{MinPerSecond: -1}
			for range 1000 {
				b.Deposit(false)
			}
			drain(b)
			time.Sleep(10 * time.Second)
			for range 500 {
				b.Deposit(false)
			}
			return drain(b), 50
		}},
		{"an unsent retry is refunded, a sent one is not", func(t *testing.T) (int, int) {
			b := &RatioBudget{MinPerSecond: -1}
			for range 100 {
				b.Deposit(false)
			}
			c1, _ := b.Withdraw(Transient)
			c2, _ := b.Withdraw(Throttling)
			b.Refund(c1, false) // never sent
			b.Refund(c2, true)  // succeeded: it was load all the same
			return drain(b), 9
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
		b := &RatioBudget{MinPerSecond: -1}
		for range 1000 {
			b.Deposit(false)
		}
		b.Withdraw(Transient)
		if got := b.Available(); got != 99 {
			t.Errorf("got %d available; want 99", got)
		}
	})
}

func TestRatioBudgetUnderContention(t *testing.T) {
	// 50 goroutines deposit 100 requests each, then all withdraw at once:
	// every deposit is counted, and the retries allowed are 10% of them,
	// give or take one per concurrent withdrawer.
	synctest.Test(t, func(t *testing.T) {
		b := &RatioBudget{MinPerSecond: -1}
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
		if allowed < 500 || allowed > 550 {
			t.Errorf("got %d retries allowed for 5,000 requests; want 500 (at most one over per withdrawer)", allowed)
		}
	})
}

func TestRatioBudgetThroughTheTransport(t *testing.T) {
	// 1,000 requests to a server that is down, 3 attempts each: a retry
	// for one request in ten, 1.1 attempts a request, as the SRE book says.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(503))
		tr := &Transport{Base: base, Budget: &RatioBudget{MinPerSecond: -1}, Policy: Policy{Rand: lowRand}}
		for range 1000 {
			roundTrip(t, tr, newReq(t, "GET", ""))
		}
		if got := len(base.Attempts()); got != 1100 {
			t.Errorf("got %d attempts for 1,000 requests; want 1,100", got)
		}
	})
}

func TestNilPointerBudget(t *testing.T) {
	// A nil *Budget in the interface field means the default, not a panic.
	synctest.Test(t, func(t *testing.T) {
		var b *Budget
		tr := &Transport{Base: rht.NewTransport(rht.Status(503), rht.Status(200)), Budget: b}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200 after a retry", code, err)
		}
		if got := tr.BudgetInUse().Available(); got != DefaultBudgetTokens {
			t.Errorf("got %d tokens; want %d (a private default bucket, refunded)", got, DefaultBudgetTokens)
		}
	})
}
