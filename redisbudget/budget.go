// Package redisbudget is a retry budget that a whole fleet shares through
// Redis: every process that names the same key draws its retries from one
// token bucket, so that 10,000 hosts facing one outage send about as many
// retries as one host would, not 10,000 times as many.
//
// The bucket follows the AWS SDKs' retry quota (retryhttp.Budget): a retry
// costs 14 tokens (5 after throttling), a first-try success adds 1, a
// successful retry gives its cost back. What changes is where the tokens
// live and how often a process talks to Redis:
//
//   - The success path never waits for Redis: a first-try success is counted
//     locally, and the count travels with the process's next call to Redis.
//   - A retry takes its tokens from a local lease, refilled from Redis in
//     batches (Lease tokens at a time): at most one Redis round trip per
//     batch. Leased tokens are already taken from Redis, so leases cannot
//     make the fleet overshoot the bucket; they can leave tokens unused in an
//     idle process's lease (at most Lease−1 a process).
//   - Take and refill run as one Lua script (EVALSHA), atomic across
//     processes: no read-modify-write races between clients.
//   - When Redis is down, slow, partitioned or holds bad data under the key,
//     a call gives up after Timeout (a few milliseconds) and the budget falls
//     back to a local token bucket for RetryAfter, then tries Redis again:
//     a request is never held longer than Timeout, nothing panics, and
//     go-redis reconnects by itself. OnFallback and Fallback report it.
//
// A Budget implements retryhttp.RetryBudget:
//
//	b, err := redisbudget.New(redisbudget.Options{Client: rdb, Key: "retry-budget:{orders-api}"})
//	tr := &retryhttp.Transport{Budget: b}
package redisbudget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
)

// Defaults, where an Options field is zero.
const (
	DefaultCapacity   = retryhttp.DefaultBudgetTokens
	DefaultLease      = 2 * retryhttp.RetryCost // two transient retries
	DefaultTimeout    = 5 * time.Millisecond
	DefaultRetryAfter = time.Second
	DefaultTTL        = time.Hour
)

// Options configure a Budget.
type Options struct {
	// Client talks to Redis: a single node, Sentinel or Cluster. Required.
	// The whole budget lives under Key, so in a Cluster it lives in one
	// hash slot.
	Client redis.UniversalClient
	// Key names the fleet's bucket: every process that uses the same key
	// shares it. Required.
	Key string
	// Capacity is the most tokens the bucket holds, and what a new (or
	// expired) bucket starts with. Zero means 500.
	Capacity int64
	// Lease is how many tokens a process takes from Redis at once, when
	// its local lease cannot pay for a retry. Zero means 28 (two transient
	// retries); it is raised to a retry's cost when smaller.
	Lease int64
	// Timeout bounds each call to Redis. Zero means 5ms.
	Timeout time.Duration
	// RetryAfter is how long the budget uses its local fallback after a
	// failed call to Redis before it tries Redis again. Zero means 1s.
	RetryAfter time.Duration
	// TTL is how long the bucket lives in Redis after its last use; an
	// expired bucket starts full again. Zero means 1h.
	TTL time.Duration
	// Fallback pays for retries while Redis cannot be reached. Nil means a
	// private retryhttp.Budget of Capacity tokens.
	Fallback retryhttp.RetryBudget
	// OnFallback, if not nil, is called when the budget falls back to its
	// local bucket (err is why) and when it is back on Redis (err is nil).
	// It is called once per change, on the goroutine of the retry that saw
	// it, and must not block.
	OnFallback func(err error)
	// Logger, if not nil, gets a Warn line when the budget falls back and
	// an Info line when it is back on Redis.
	Logger *slog.Logger
}

// A Budget is a retry budget shared through Redis. Make one with New; it is
// safe for concurrent use.
type Budget struct {
	opts     Options
	fallback retryhttp.RetryBudget

	lease    atomic.Int64 // tokens taken from Redis and not yet spent
	deposits atomic.Int64 // first-try successes not yet sent
	seen     atomic.Int64 // the bucket's tokens at this process's last refill

	mu        sync.Mutex // one refill at a time
	downUntil atomic.Int64
	down      atomic.Bool
	lastErr   atomic.Pointer[error]
}

var _ retryhttp.RetryBudget = (*Budget)(nil)

// ErrBadData is the cause reported when the key holds something that is not
// a budget (another type, or a hash whose fields are not numbers).
var ErrBadData = errors.New("redisbudget: the key does not hold a retry budget")

// New returns a Budget. It does not talk to Redis until the first retry.
func New(opts Options) (*Budget, error) {
	if opts.Client == nil {
		return nil, errors.New("redisbudget: Options.Client is nil")
	}
	if opts.Key == "" {
		return nil, errors.New("redisbudget: Options.Key is empty")
	}
	if opts.Capacity <= 0 {
		opts.Capacity = DefaultCapacity
	}
	if opts.Lease <= 0 {
		opts.Lease = DefaultLease
	}
	opts.Lease = max(opts.Lease, retryhttp.RetryCost)
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = DefaultRetryAfter
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	b := &Budget{opts: opts, fallback: opts.Fallback}
	b.seen.Store(opts.Capacity) // a new bucket is full
	if b.fallback == nil {
		b.fallback = retryhttp.NewBudget(int(opts.Capacity))
	}
	return b, nil
}

// takeScript takes between need and lease tokens (as many as the bucket
// holds, up to lease; none if it holds less than need) after adding the
// caller's pending deposits, in one atomic step. A missing bucket starts
// full. KEYS[1] the bucket; ARGV: deposit, need, lease, capacity, ttl (ms).
// It returns the tokens granted and the tokens left.
var takeScript = redis.NewScript(`
local t = redis.call('HGET', KEYS[1], 'tokens')
local cap = tonumber(ARGV[4])
if t == false then
  t = cap
else
  t = tonumber(t)
  if t == nil then return redis.error_reply('BADDATA tokens is not a number') end
end
t = math.min(cap, t + tonumber(ARGV[1]))
local need, lease = tonumber(ARGV[2]), tonumber(ARGV[3])
local granted = 0
if t >= need then
  granted = math.min(t, lease)
  t = t - granted
end
redis.call('HSET', KEYS[1], 'tokens', t)
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return {granted, t}
`)

// Deposit counts a first-try success locally; it reaches Redis with this
// process's next refill. The success path never talks to Redis.
//
// A success counts only up to the room the bucket had when this process
// last saw it: a full bucket drops deposits, as the AWS quota does, and
// deposits held back while it was full must not be added later, when the
// bucket has drained, or a fleet of processes would overshoot it together.
func (b *Budget) Deposit(success bool) {
	if b.down.Load() {
		b.fallback.Deposit(success)
		return
	}
	if success && b.deposits.Load() < b.opts.Capacity-b.seen.Load() {
		b.deposits.Add(retryhttp.SuccessReward)
	}
}

// Withdraw pays for a retry from the local lease, refilling it from Redis
// when it cannot pay (one round trip, bounded by Timeout). When Redis
// cannot be reached, the local fallback pays, and the budget says so. The
// Tokens name who paid: a refund goes back to the lease (the fleet's
// tokens) or to the fallback, whichever paid, whatever the budget uses by
// the time of the refund.
func (b *Budget) Withdraw(c retryhttp.Class) (retryhttp.Tokens, bool) {
	cost := c.Cost()
	if b.takeLease(cost) {
		return b.paid(cost)
	}
	if b.inFallback() {
		return b.fallback.Withdraw(c)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.takeLease(cost) { // another retry refilled it meanwhile
		return b.paid(cost)
	}
	granted, err := b.refill(cost)
	if err != nil {
		b.fallBack(err)
		return b.fallback.Withdraw(c)
	}
	b.recovered()
	if granted == 0 {
		return retryhttp.Tokens{}, false
	}
	b.lease.Add(granted - cost)
	return b.paid(cost)
}

// paid is a payment from the lease.
func (b *Budget) paid(cost int64) (retryhttp.Tokens, bool) {
	return retryhttp.Tokens{Cost: cost, Payer: (*lease)(b)}, true
}

// takeLease takes cost tokens from the local lease if it holds them.
func (b *Budget) takeLease(cost int64) bool {
	for {
		cur := b.lease.Load()
		if cur < cost {
			return false
		}
		if b.lease.CompareAndSwap(cur, cur-cost) {
			return true
		}
	}
}

// lease is the Payer of what the lease paid: a refund goes back into it (the
// tokens were taken from the fleet's bucket, and stay the fleet's).
type lease Budget

func (l *lease) Refund(t retryhttp.Tokens, sent bool) { l.lease.Add(t.Cost) }

// Available reports the tokens this process holds in its lease, or the
// fallback's while Redis cannot be reached. The fleet's bucket is in Redis:
// Tokens reads it.
func (b *Budget) Available() int {
	if b.down.Load() {
		return b.fallback.Available()
	}
	return int(b.lease.Load())
}

// Fallback reports whether the budget is using its local fallback because
// Redis could not be reached, and why.
func (b *Budget) Fallback() (bool, error) {
	if !b.down.Load() {
		return false, nil
	}
	if p := b.lastErr.Load(); p != nil {
		return true, *p
	}
	return true, nil
}

// Tokens reads the fleet's bucket in Redis (a missing bucket is full), with
// the budget's Timeout.
func (b *Budget) Tokens(ctx context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	defer cancel()
	v, err := b.opts.Client.HGet(ctx, b.opts.Key, "tokens").Int64()
	if errors.Is(err, redis.Nil) {
		return b.opts.Capacity, nil
	}
	return v, err
}

// refill runs the take script with this process's pending deposits. The
// call is bounded by Timeout whatever the client's own timeouts: it runs on
// a goroutine of its own, and a late answer still lands in the lease (its
// tokens were taken from Redis; losing them would waste them).
func (b *Budget) refill(need int64) (granted int64, err error) {
	deposit := b.deposits.Swap(0)
	type result struct {
		granted int64
		err     error
	}
	done := make(chan result, 1)
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.Timeout)
	defer cancel()
	late := &atomic.Bool{}
	go func() {
		// The client's own context timeout may be off (go-redis's
		// ContextTimeoutEnabled): the call then ends at its read timeout.
		r, err := takeScript.Run(ctx, b.opts.Client, []string{b.opts.Key},
			deposit, need, b.opts.Lease, b.opts.Capacity, b.opts.TTL.Milliseconds()).Int64Slice()
		res := result{err: err}
		if err == nil && len(r) == 2 {
			res.granted = r[0]
			b.seen.Store(r[1])
		} else if err == nil {
			res.err = fmt.Errorf("redisbudget: unexpected reply %v", r)
		}
		if res.err != nil && isBadData(res.err) {
			res.err = fmt.Errorf("%w: %v", ErrBadData, res.err)
		}
		if late.Swap(true) && res.err == nil {
			b.lease.Add(res.granted) // the caller gave up: keep the tokens
		}
		done <- res
	}()
	timer := time.NewTimer(b.opts.Timeout)
	defer timer.Stop()
	select {
	case res := <-done:
		if res.err != nil {
			b.deposits.Add(deposit) // not delivered: send it next time
		}
		return res.granted, res.err
	case <-timer.C:
		if late.Swap(true) {
			res := <-done // it answered just now
			return res.granted, res.err
		}
		b.deposits.Add(deposit)
		return 0, fmt.Errorf("redisbudget: no answer from Redis within %v", b.opts.Timeout)
	}
}

// isBadData reports whether err is Redis's answer to a key of the wrong
// type, or the script's to a field that is not a number.
func isBadData(err error) bool {
	var re redis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return len(msg) >= 9 && (msg[:9] == "WRONGTYPE" || msg[:7] == "BADDATA")
}

func (b *Budget) inFallback() bool {
	if !b.down.Load() {
		return false
	}
	return time.Now().UnixNano() < b.downUntil.Load()
}

// fallBack switches to the local bucket for RetryAfter, reporting the first
// failure of a run of them.
func (b *Budget) fallBack(err error) {
	b.downUntil.Store(time.Now().Add(b.opts.RetryAfter).UnixNano())
	b.lastErr.Store(&err)
	if !b.down.Swap(true) {
		if b.opts.Logger != nil {
			b.opts.Logger.Warn("redisbudget: Redis unreachable, using the local fallback budget",
				slog.String("key", b.opts.Key), slog.Duration("retry_after", b.opts.RetryAfter), slog.String("error", err.Error()))
		}
		if b.opts.OnFallback != nil {
			b.opts.OnFallback(err)
		}
	}
}

// recovered switches back to Redis after a successful call.
func (b *Budget) recovered() {
	if b.down.Swap(false) {
		if b.opts.Logger != nil {
			b.opts.Logger.Info("redisbudget: back on Redis", slog.String("key", b.opts.Key))
		}
		if b.opts.OnFallback != nil {
			b.opts.OnFallback(nil)
		}
	}
}
