package redisbudget

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
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
			s := startRedis(t)
			opts := tc.opts
			opts.Addr = s.addr()
			rdb := redis.NewClient(&opts)
			defer rdb.Close()
			b := newBudget(t, rdb, "fleet", func(o *Options) { o.Timeout = timeout })
			<-b.warmed
			if got, err := b.Tokens(context.Background()); err != nil || got != DefaultCapacity {
				t.Fatalf("before the pause: got %d, %v; want %d, nil", got, err, DefaultCapacity)
			}
			s.pause()
			start := time.Now()
			_, err := b.Tokens(context.Background())
			took := time.Since(start)
			s.resume()
			if took > timeout+100*time.Millisecond || !errors.Is(err, ErrTimeout) {
				t.Errorf("Tokens against a paused Redis: took %v, err %v; want about the %v Timeout and ErrTimeout", took, err, timeout)
			}
			waitFor(t, "the read to end", func() bool { return b.out.Load() == 0 })
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
	if _, ok := b.Withdraw(retryhttp.Transient); !ok { // leases 28: the bucket at 462, room for 38
		t.Fatal("refused")
	}
	start := time.Now()
	for time.Since(start) < 10*recheck { // 1,000 successes or more, over 10 Rechecks
		for range 100 {
			b.Deposit(true)
		}
		time.Sleep(time.Millisecond)
	}
	waitFor(t, "the call carrying the deposits", func() bool { return b.out.Load() == 0 })
	if got, want := s.tokens("fleet"), int64(DefaultCapacity-10-DefaultLease+38); got != want {
		t.Errorf("got %d tokens in Redis after 10 Rechecks of successes; want %d: the 38 deposits the room took, sent", got, want)
	}
}
