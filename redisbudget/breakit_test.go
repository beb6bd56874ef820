package redisbudget

import (
	"context"
	"math"
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
	if _, ok := idle.Withdraw(context.Background(), retryhttp.Transient); !ok { // a lease of 140, 14 spent
		t.Fatal("the idle process's first retry was refused")
	}
	// The busy process keeps the hash alive past the idle one's TTL, its
	// successes refilling what it spends.
	for i, start := 0, time.Now(); time.Since(start) < 2*ttl; i++ {
		if i%6 == 0 {
			busy.Withdraw(context.Background(), retryhttp.Transient)
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
			if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
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

// Durations far past any real need (math.MaxInt64, "never") must not wrap:
// a Timeout of forever still asks Redis, a Recheck of forever still
// refuses locally after the bucket ran dry, a RetryAfter of forever keeps
// the fallback, and a TTL of forever keeps the bucket.
func TestHugeDurations(t *testing.T) {
	const forever = time.Duration(math.MaxInt64)
	s := startRedis(t)
	t.Run("Timeout", func(t *testing.T) {
		b := newBudget(t, s.client(), "timeout", func(o *Options) { o.Timeout = forever })
		if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
			t.Fatal("refused")
		}
		if st := b.Stats(); st.Taken == 0 || st.FallbackPayments != 0 {
			t.Errorf("got %d tokens taken from Redis, %d fallback payments; want a lease from Redis, no fallback", st.Taken, st.FallbackPayments)
		}
	})
	t.Run("Recheck", func(t *testing.T) {
		b := newBudget(t, s.client(), "recheck", func(o *Options) {
			o.Recheck, o.Capacity, o.Timeout = forever, retryhttp.RetryCost, time.Second
		})
		b.Withdraw(context.Background(), retryhttp.Transient) // the whole bucket
		b.Withdraw(context.Background(), retryhttp.Transient) // a call: the bucket is empty
		calls := b.Stats().Calls
		for range 10 {
			if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); ok {
				t.Fatal("a retry was paid from an empty bucket")
			}
		}
		if got := b.Stats().Calls - calls; got != 0 {
			t.Errorf("got %d calls to Redis for 10 retries after the bucket ran dry; want 0 (refused locally for Recheck)", got)
		}
	})
	t.Run("RetryAfter", func(t *testing.T) {
		dead := startRedis(t)
		rdb := dead.client()
		b := newBudget(t, rdb, "retryafter", func(o *Options) { o.RetryAfter = forever; o.Timeout = time.Second })
		dead.stop()
		b.Withdraw(context.Background(), retryhttp.Transient) // fails: falls back
		calls := b.Stats().Calls
		for range 10 {
			b.Withdraw(context.Background(), retryhttp.Transient)
		}
		if got := b.Stats().Calls - calls; got != 0 {
			t.Errorf("got %d calls to an unreachable Redis within RetryAfter; want 0", got)
		}
	})
	t.Run("TTL", func(t *testing.T) {
		b := newBudget(t, s.client(), "ttl", func(o *Options) { o.TTL = forever; o.Timeout = time.Second })
		if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
			t.Fatal("refused")
		}
		if st := b.Stats(); st.Taken == 0 || st.Failures != 0 {
			t.Errorf("got %d tokens taken, %d failed calls; want a lease from Redis", st.Taken, st.Failures)
		}
		if got := s.tokens("ttl"); got != DefaultCapacity-DefaultLease {
			t.Errorf("got %d tokens in the bucket; want %d", got, DefaultCapacity-DefaultLease)
		}
	})
}
