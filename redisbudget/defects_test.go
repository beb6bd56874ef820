package redisbudget

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Tokens against a paused Redis, with go-redis's default client (its
// context timeout off: a context's deadline never reaches the socket),
// returns within about the budget's Timeout, with ErrTimeout, and the
// read it started ends once Redis answers (it used to take the client's
// ReadTimeout, 5 s with these options, against a Timeout of 100ms).
func TestTokensEndsWithinTheTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	for _, tc := range []struct {
		name string
		opts redis.Options
	}{
		{"context timeout off", redis.Options{}},
		{"context timeout on", redis.Options{ContextTimeoutEnabled: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer noLeaks(t, goleak.IgnoreCurrent()) // the read it started has ended
			s := startRedis(t)
			opts := tc.opts
			opts.Addr = s.addr()
			rdb := redis.NewClient(&opts)
			defer rdb.Close()
			b := newBudget(t, rdb, "fleet", func(o *Options) { o.Timeout = timeout })
			// Connected: a loaded machine may take more than the Timeout
			// for the first dial.
			waitFor(t, "a read before the pause", func() bool {
				got, err := b.Tokens(context.Background())
				return err == nil && got == DefaultCapacity
			})
			s.pause()
			start := time.Now()
			_, err := b.Tokens(context.Background())
			took := time.Since(start)
			s.resume()
			if took > timeout+100*time.Millisecond || !errors.Is(err, ErrTimeout) {
				t.Errorf("Tokens against a paused Redis: took %v, err %v; want about the %v Timeout and ErrTimeout", took, err, timeout)
			}
		})
	}
}

// A process whose pending deposits reach the room it last saw in the
// bucket keeps making first-try successes: once Recheck has passed they
// travel on their own, as Deposit promises, and the bucket is full again
// (they used to stay in the process, every Deposit returning before the
// code that sends them, until the next retry).
func TestDepositsAtTheRoomLimitTravel(t *testing.T) {
	const recheck = 50 * time.Millisecond
	s := startRedis(t)
	s.client().HSet(context.Background(), "fleet", "tokens", DefaultCapacity-10)
	b := newBudget(t, s.client(), "fleet", func(o *Options) { o.Recheck = recheck; o.Timeout = time.Second })
	if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok { // leases 28, spends 14: the bucket at 462
		t.Fatal("refused")
	}
	start := time.Now()
	for time.Since(start) < 10*recheck { // 1,000 successes or more, over 10 Rechecks
		for range 100 {
			b.Deposit(true)
		}
		time.Sleep(time.Millisecond)
	}
	// Full again: the bucket and what this process holds in its lease.
	want := int64(DefaultCapacity - b.Available())
	for deadline := time.Now().Add(time.Second); s.tokens("fleet") != want && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond) // the last call's answer
	}
	if got := s.tokens("fleet"); got != want {
		t.Errorf("got %d tokens in Redis after 10 Rechecks of successes; want %d, the capacity less the %d in the lease: the deposits the room took, sent",
			got, want, b.Available())
	}
}

// Ten processes each keep a full batch (28 tokens) in their lease after a
// retry that succeeded (its refund back in the lease); first-try successes
// then refill the bucket; then an outage. The fleet makes at most the
// retries of one retryhttp.Budget shared by the same ten Transports and
// driven the same way: the leases count against the bucket, so deposits
// fill only the room they leave (Redis alone used to take the deposits up
// to 500 beside 280 leased tokens: 55 to 58 retries against 35).
func TestLeasesCountAgainstARefilledBucket(t *testing.T) {
	const procs = 10
	s := startRedis(t)
	var budgets []retryhttp.Budget
	for range procs {
		budgets = append(budgets, newBudget(t, s.client(), "fleet", func(o *Options) {
			o.Recheck = 20 * time.Millisecond
			o.Timeout = time.Second
		}))
	}
	one := retryhttp.NewTokenBucket(DefaultCapacity)
	shared := make([]retryhttp.Budget, procs)
	for i := range shared {
		shared[i] = one
	}
	drive := func(bs []retryhttp.Budget) int {
		for _, b := range bs { // a retry that succeeded: its refund back
			tk, ok := b.Withdraw(context.Background(), retryhttp.Transient)
			if !ok {
				t.Fatal("the first retry was refused")
			}
			tk(true)
		}
		for range 30 { // first-try successes: 3,000, over 30 Rechecks
			for _, b := range bs {
				for range 10 {
					b.Deposit(true)
				}
			}
			time.Sleep(25 * time.Millisecond)
		}
		retries := 0
		for range 3 { // the outage: every process retries until refused, a Recheck apart
			for more := true; more; {
				more = false
				for _, b := range bs {
					b.Deposit(false)
					if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); ok {
						retries++
						more = true
					}
				}
			}
			time.Sleep(40 * time.Millisecond)
		}
		return retries
	}
	want := drive(shared)
	got := drive(budgets)
	for _, b := range budgets {
		if down, err := b.(*Budget).Fallback(); down {
			t.Fatalf("a budget fell back: %v", err)
		}
	}
	if got > want {
		t.Errorf("got %d retries from 10 processes with their leases beside a refilled bucket; want at most %d, one shared retryhttp.Budget's", got, want)
	}
	t.Logf("fleet %d retries, one retryhttp.Budget %d", got, want)
}

// records counts the process records in the bucket's hash.
func records(t *testing.T, s *redisServer, key string) int {
	t.Helper()
	fields, err := s.client().HKeys(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range fields {
		if strings.HasPrefix(f, "p:") {
			n++
		}
	}
	return n
}

// The per-process records are bounded by the TTL: 150 processes call once
// and stop (their hash is past Redis's small encoding, so the sweep goes a
// few fields a step); one process keeps calling, and soon after the TTL
// only its own record is left, the leases of the
// others given back to the bucket. When it stops too, the whole hash
// expires a TTL later.
func TestRecordsExpireWithTheTTL(t *testing.T) {
	const ttl = 300 * time.Millisecond
	s := startRedis(t)
	rdb := s.client()
	opts := func(o *Options) { o.TTL = ttl; o.Capacity = 1 << 20; o.Timeout = time.Second }
	for range 150 {
		b := newBudget(t, rdb, "fleet", opts)
		if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok { // a lease of 28, 14 spent
			t.Fatal("refused")
		}
	}
	if got := records(t, s, "fleet"); got != 150 {
		t.Fatalf("got %d records; want 150, one a process", got)
	}
	live := newBudget(t, rdb, "fleet", opts)
	call := func() { // one call to Redis
		for c := live.Stats().Calls; live.Stats().Calls == c; {
			live.Withdraw(context.Background(), retryhttp.Transient)
		}
	}
	for start := time.Now(); time.Since(start) < ttl+50*time.Millisecond; {
		call() // the hash lives on
		time.Sleep(ttl / 10)
	}
	// A sweep step every 10 ms at most, 8 fields or so a step.
	calls, sweep := 0, time.Now()
	for records(t, s, "fleet") > 1 {
		if time.Since(sweep) > 2*time.Second {
			t.Fatalf("%d records left %v past the TTL (%d calls); want 1, the live process's", records(t, s, "fleet"), time.Since(sweep), calls)
		}
		call()
		calls++
		time.Sleep(time.Millisecond)
	}
	leased, err := rdb.HGet(context.Background(), "fleet", "leased").Int64()
	if err != nil || leased > DefaultLease {
		t.Errorf("got %d tokens leased (%v) with one live process; want at most its lease, %d", leased, err, DefaultLease)
	}
	t.Logf("150 records of processes gone, swept %v after the TTL (%d calls)", time.Since(sweep), calls)
	time.Sleep(ttl + 50*time.Millisecond)
	if n := rdb.Exists(context.Background(), "fleet").Val(); n != 0 {
		t.Errorf("the bucket's hash still exists a TTL after its last call")
	}
}
