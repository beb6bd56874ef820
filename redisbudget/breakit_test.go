package redisbudget

import (
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
)

// A process that holds a lease and makes no call for a TTL, while the rest
// of the fleet keeps the hash alive, has its record swept: Redis gives its
// lease back to the bucket. The process must not spend those tokens too,
// or the lease and the bucket's refilled tokens add up to more than one
// bucket: the next outage pays for more retries than Capacity allows.
func TestSweptLeaseIsNotSpentTwice(t *testing.T) {
	const ttl = 300 * time.Millisecond
	s := startRedis(t)
	rdb := s.client()
	idle := newBudget(t, rdb, "fleet", func(o *Options) {
		o.TTL, o.Lease, o.Recheck, o.Timeout = ttl, 140, 20*time.Millisecond, time.Second
	})
	busy := newBudget(t, rdb, "fleet", func(o *Options) {
		o.TTL, o.Recheck, o.Timeout = ttl, 20*time.Millisecond, time.Second
	})
	if _, ok := idle.Withdraw(retryhttp.Transient); !ok { // a lease of 140, 14 spent
		t.Fatal("the idle process's first retry was refused")
	}
	// The busy process keeps the hash alive past the idle one's TTL, its
	// successes refilling what it spends.
	for i, start := 0, time.Now(); time.Since(start) < 2*ttl; i++ {
		if i%6 == 0 {
			busy.Withdraw(retryhttp.Transient)
		}
		for range 5 {
			busy.Deposit(true)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := records(t, s, "fleet"); n != 1 {
		t.Fatalf("got %d records; want 1 (the idle process's swept)", n)
	}
	// Successes refill the bucket to whatever room Redis sees.
	for range 15 { // 150 ms, within the TTL: the hash lives on
		for range 20 {
			busy.Deposit(true)
		}
		time.Sleep(10 * time.Millisecond)
	}
	bucket := s.tokens("fleet")
	held := int64(idle.Available() + busy.Available())
	if bucket+held > DefaultCapacity {
		t.Errorf("got %d tokens in the bucket plus %d held in leases (idle %d); want at most Capacity, %d",
			bucket, held, idle.Available(), DefaultCapacity)
	}
	retries := 0 // the outage: both retry until refused
	for _, b := range []*Budget{idle, busy} {
		for {
			b.Deposit(false)
			if _, ok := b.Withdraw(retryhttp.Transient); !ok {
				break
			}
			retries++
		}
		if down, err := b.Fallback(); down {
			t.Fatalf("a budget fell back: %v", err)
		}
	}
	if want := DefaultCapacity / retryhttp.RetryCost; retries > want {
		t.Errorf("got %d retries in the outage; want at most %d, one bucket's", retries, want)
	}
	t.Logf("bucket %d + leases %d; %d retries in the outage", bucket, held, retries)
}
