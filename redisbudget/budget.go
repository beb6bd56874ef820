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
//     locally, and the count travels with the process's next call to Redis,
//     at most one call every Recheck when no retry needs one.
//   - A retry takes its tokens from a local lease, refilled from Redis in
//     batches (at least Lease tokens at a time, more when several retries
//     wait): one Redis round trip per batch, shared by every retry that
//     waits for it. Leases count against the bucket: Redis keeps the
//     tokens each process holds and has not spent, and deposits fill only
//     the room the bucket and the leases leave, so leases cannot make the
//     fleet overshoot the bucket.
//   - Each call carries the process's sequence number and its totals
//     (tokens granted, spent, deposits), and Redis keeps a record of each
//     process beside the bucket, in the same hash: a call is applied once,
//     however often the client sends it, and its answer carries the
//     process's granted total, so a lost answer's tokens arrive with the
//     next one. Any go-redis settings will do.
//   - A process that saw the bucket hold too little for a retry refuses
//     retries locally, without asking Redis, for about Recheck: while the
//     fleet's bucket is empty each process calls Redis about once a Recheck,
//     whatever its request rate.
//   - Take and refill run as one Lua script (EVALSHA), atomic across
//     processes: no read-modify-write races between clients.
//   - When Redis is down, slow, partitioned or holds bad data under the key,
//     a withdrawal gives up after Timeout and the budget falls back to a
//     local token bucket for RetryAfter, then tries Redis again: a
//     withdrawal is never held much longer than Timeout, however many run at
//     once, nothing panics, and go-redis reconnects by itself. OnFallback and
//     Fallback report it.
//
// A Budget implements retryhttp.Budget:
//
//	b, err := redisbudget.New(redisbudget.Options{Client: rdb, Key: "retry-budget:{orders-api}"})
//	tr := &retryhttp.Transport{Budget: b}
package redisbudget

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
)

// Defaults, where an Options field is zero.
const (
	// DefaultCapacity is the AWS quota's bucket: 35 transient retries.
	DefaultCapacity = retryhttp.DefaultBudgetTokens
	// DefaultLease is two transient retries: a process that
	// retries makes one Redis call per two retries at most.
	DefaultLease = 2 * retryhttp.RetryCost
	// DefaultTimeout leaves room for a Redis one network hop away (a
	// round trip of a few milliseconds across availability zones), a
	// connection the process had to open first, and a loaded host whose
	// scheduler or collector pauses the process for a while: a call that
	// times out falls back, and a fleet whose calls fall back retries as
	// many private budgets would. It is the most a retry waits for a Redis
	// that does not answer; one that answers takes a round trip.
	DefaultTimeout = 250 * time.Millisecond
	// DefaultRetryAfter is how long a fallback lasts before Redis is tried
	// again: at most one call a second per process while Redis is
	// unreachable.
	DefaultRetryAfter = time.Second
	// DefaultRecheck is how long a process that saw the bucket empty
	// refuses locally before asking again: at most one call a second per
	// process during an outage, and retries back about a second after
	// successes refill the bucket.
	DefaultRecheck = time.Second
	// DefaultTTL is how long an unused bucket lives.
	DefaultTTL = time.Hour
)

// Options configure a Budget.
type Options struct {
	// Client talks to Redis: a single node, Sentinel or Cluster. Required.
	// The whole budget lives under Key, so in a Cluster it lives in one
	// hash slot. Any settings will do: Redis applies each call once, even
	// when the client sends it again (MaxRetries, a Cluster's redirects),
	// and a call the client gave up on (ContextTimeoutEnabled) has its
	// tokens brought by the next answer (docs/fleet.md).
	Client redis.UniversalClient
	// Key names the fleet's bucket: every process that uses the same key
	// shares it. Required.
	Key string
	// Capacity is the most tokens the bucket holds, and what a new (or
	// expired) bucket starts with. Zero means 500. More than 2^53 means
	// 2^53: the script counts in Lua's doubles, exact up to there.
	Capacity int64
	// Lease is the least number of tokens a process takes from Redis at
	// once, when its local lease cannot pay for a retry. Zero means 28
	// (two transient retries). A call never takes less than the retry it
	// pays for costs, nor more than the bucket holds.
	Lease int64
	// Timeout bounds each withdrawal that has to ask Redis. Zero means
	// 250ms (DefaultTimeout). More than 100 years means 100 years.
	Timeout time.Duration
	// RetryAfter is how long the budget uses its local fallback after a
	// failed call to Redis before it tries Redis again, drawn at random
	// between one and one and a half RetryAfter. Zero means 1s. More
	// than 100 years means 100 years.
	RetryAfter time.Duration
	// Recheck is how long a process refuses retries locally after it saw
	// the bucket hold too little for one, before it asks Redis again; it is
	// also the least time between two calls that only carry deposits. Each
	// wait is drawn at random between one and one and a half Recheck, so
	// that a fleet's processes do not ask together. Zero means 1s. More
	// than 100 years means 100 years.
	Recheck time.Duration
	// Shards splits the fleet's bucket into this many buckets of
	// Capacity/Shards tokens each, under keys in different hash slots
	// (ShardKey), so that a Redis Cluster spreads the budget's load over
	// its shards. Each process draws from one of them, chosen at random
	// when the Budget is made; together they hold Capacity tokens at most,
	// so the fleet's bound is unchanged. A shard may refuse while another
	// has tokens left. Zero or one means one bucket, under Key.
	Shards int
	// TTL is how long the bucket lives in Redis after its last change; an
	// expired bucket starts full again. Zero means 1h. Less than a
	// millisecond is an error: Redis counts it in milliseconds, and 0
	// would delete the bucket as soon as it is written. More than 100
	// years means 100 years. A process with no call answered for TTL
	// drops its lease: Redis may have swept its record, giving the lease
	// back to the bucket.
	TTL time.Duration
	// Fallback pays for retries while Redis cannot be reached. Nil means a
	// private retryhttp.NewTokenBucket of Capacity tokens.
	Fallback retryhttp.Budget
	// OnFallback, if not nil, is called when the budget falls back to its
	// local bucket (err is why) and when it is back on Redis (err is nil).
	// It is called once per change, before any withdrawal that waited for
	// the call that saw it returns, and must not block. It may run on the
	// budget's own goroutine, where no caller could recover a panic: a
	// panic in it is recovered and logged at Error level (to Logger, or
	// slog.Default if Logger is nil).
	OnFallback func(err error)
	// Logger, if not nil, gets a Warn line when the budget falls back and
	// an Info line when it is back on Redis.
	Logger *slog.Logger
}

// A Budget is a retry budget shared through Redis. Make one with New; it is
// safe for concurrent use.
type Budget struct {
	opts     Options
	key      string // the bucket this process draws from: Key, or a shard's
	capacity int64  // its capacity
	fallback retryhttp.Budget
	epoch    time.Time // the clock's origin: times below are nanoseconds since

	// The process's record in the bucket's hash (the fleet protocol): its
	// field's name, and its totals, which every call carries.
	id string
	// The refunds of the lease's two costs, made once so that a retry
	// allocates none.
	refundRetry, refundThrottle func(bool)

	lease     atomic.Int64 // tokens granted and not yet spent
	spent     atomic.Int64 // tokens gone from the lease, in total: paid (refunds deducted) or expired
	confirmed atomic.Int64 // when the freshest call that answered was sent: its record is that recent
	deposits  atomic.Int64 // first-try successes counted for Redis, in total
	seenDep   atomic.Int64 // of them, those Redis has seen (credited, or no room)
	seen      atomic.Int64 // the bucket's tokens at this process's last answer
	room      atomic.Int64 // the room for deposits at its last answer, less the tokens spent its call reported
	next      atomic.Int64 // before it, a bucket seen too low is not asked again

	mu       sync.Mutex
	fl       *flight // the call to Redis in progress, if any
	waiting  int64   // tokens wanted by the withdrawals waiting for a call
	seq      int64   // the sequence number of the last call sent
	answered int64   // the sequence number of the freshest answer

	downUntil atomic.Int64
	down      atomic.Bool
	lastErr   atomic.Pointer[error]
	reportMu  sync.Mutex // OnFallback and Logger calls, one at a time, in order

	stats  counters
	out    atomic.Int64  // goroutines of calls still out (and the warm-up)
	warmed chan struct{} // closed when the warm-up is over, done or not
}

// A flight is one call to Redis, shared by every withdrawal that waits for
// it. done is closed when the call answered or its Timeout passed.
type flight struct {
	done  chan struct{}
	end   int64 // on the budget's clock: done is closed by then
	seq   int64 // the call's sequence number
	sent  int64 // on the budget's clock: when it was sent
	spent int64 // the tokens spent it reported
	over  bool  // done is closed (under Budget.mu)
}

type counters struct {
	calls, failures, refused, fallbackPaid, taken, credited, dropped atomic.Int64
}

var _ retryhttp.Budget = (*Budget)(nil)

// ErrBadData is the cause reported when the key holds something that is not
// a budget (another type, or a hash whose fields are not numbers).
var ErrBadData = errors.New("redisbudget: the key does not hold a retry budget")

// ErrTimeout is the cause reported when Redis did not answer within Timeout.
var ErrTimeout = errors.New("redisbudget: no answer from Redis")

// New returns a Budget. It starts connecting to Redis and loading the
// budget's script in the background, so that a new process's first retry
// does not pay for the connection; nothing waits for that.
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
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.RetryAfter <= 0 {
		opts.RetryAfter = DefaultRetryAfter
	}
	if opts.Recheck <= 0 {
		opts.Recheck = DefaultRecheck
	}
	if opts.TTL <= 0 {
		opts.TTL = DefaultTTL
	}
	if opts.TTL < time.Millisecond {
		// PEXPIRE takes milliseconds, and 0 deletes the key at once:
		// every call would find a full bucket.
		return nil, fmt.Errorf("redisbudget: TTL %v is under a millisecond: the bucket would be deleted as soon as it is written", opts.TTL)
	}
	// The script counts in Lua numbers (doubles): past 2^53 they are not
	// exact, and the integer reply of a larger one wraps.
	opts.Capacity = min(opts.Capacity, maxExact)
	// The budget adds its durations to its clock, Recheck and RetryAfter
	// times one and a half: "forever" (math.MaxInt64) would wrap negative.
	opts.Timeout, opts.RetryAfter = min(opts.Timeout, maxDuration), min(opts.RetryAfter, maxDuration)
	opts.Recheck, opts.TTL = min(opts.Recheck, maxDuration), min(opts.TTL, maxDuration)
	b := &Budget{opts: opts, key: opts.Key, capacity: opts.Capacity, fallback: opts.Fallback, epoch: time.Now(), warmed: make(chan struct{}),
		id: strconv.FormatUint(rand.Uint64(), 36)}
	if opts.Shards > 1 {
		b.key, b.capacity = ShardKey(opts.Key, rand.IntN(opts.Shards)), opts.Capacity/int64(opts.Shards)
		if b.capacity < retryhttp.RetryCost {
			return nil, fmt.Errorf("redisbudget: a shard of %d tokens (Capacity/Shards) cannot pay for a retry (%d)", b.capacity, retryhttp.RetryCost)
		}
	}
	b.seen.Store(b.capacity) // a new bucket is full
	b.refundRetry, b.refundThrottle = b.leaseRefund(retryhttp.RetryCost), b.leaseRefund(retryhttp.ThrottleRetryCost)
	// A nil *retryhttp.Budget is none, as Transport.Budget reads it.
	if b.fallback == nil || isNilPointer(b.fallback) {
		b.fallback = retryhttp.NewTokenBucket(int(opts.Capacity))
	}
	b.out.Add(1)
	go b.warm()
	return b, nil
}

// warm opens a connection and loads the script, off any retry's path. It
// changes nothing else: a failure here is seen, and reported, by the first
// call that needs Redis.
func (b *Budget) warm() {
	defer b.out.Add(-1)
	defer close(b.warmed)
	ctx, cancel := context.WithTimeout(context.Background(), warmTimeout)
	defer cancel()
	takeScript.Load(ctx, b.opts.Client)
}

// maxExact is the largest Capacity the script counts exactly: 2^53.
const maxExact = 1 << 53

// maxDuration is the longest Timeout, RetryAfter, Recheck or TTL: 100
// years. The budget's clock, plus one and a half of it, stays in an int64.
const maxDuration = 100 * 365 * 24 * time.Hour

// isNilPointer reports whether b is a nil pointer in a non-nil interface,
// such as a *retryhttp.Budget never set.
func isNilPointer(b retryhttp.Budget) bool {
	v := reflect.ValueOf(b)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// warmTimeout bounds the background warm-up: a connection and a SCRIPT LOAD.
const warmTimeout = 5 * time.Second

// takeScript is the fleet protocol's one step, atomic in Redis. The bucket
// is one hash: its tokens, the tokens its processes hold in leases
// (leased), the sweep's cursor and time (swept), the calls applied already that came again
// (replayed), and one record per process (field p:<id>):
// the sequence number of its last call applied, the tokens granted to it
// in total, the deposits seen in total and, of them, credited, the
// deposits of unknown fate, the tokens it reported spent, and the time of
// its last call (ms). A call carries the process's sequence number and
// totals. A call whose number is not above the record's was applied
// already (the client sent it again, it ran late, or a Cluster redirected
// it): it changes nothing but a count of such calls (replayed) and
// returns the record. Otherwise the script
// credits the deposits beyond the record's total, up to the room the
// tokens and the leases leave under the capacity; grants as many tokens as
// the bucket holds up to max(want, need) if it holds need; keeps tokens
// plus leased within the capacity; removes records untouched for ttl (a
// few at a time from the cursor, at most one step every 10 ms, so that a
// call costs the same however many records the hash holds); and sets the
// expiry. A missing bucket
// starts full; a missing record starts from the process's totals (its
// deposits not yet seen are of unknown fate if an earlier call of the
// process may have been applied). KEYS[1] the bucket; ARGV: id, seq,
// need, want, capacity, ttl (ms), then the process's totals: granted,
// deposits, spent, deposits seen, credited, unknown; then 1 if an earlier
// call may have been applied. It returns the record's granted, seen,
// credited and unknown totals, the bucket's tokens, and the room for
// deposits.
var takeScript = redis.NewScript(`
if redis.replicate_commands then redis.replicate_commands() end
local key, id = KEYS[1], 'p:' .. ARGV[1]
local seq, need, want = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local cap, ttl = tonumber(ARGV[5]), tonumber(ARGV[6])
local gk, dt, ut = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local dk, ck, xk = tonumber(ARGV[10]), tonumber(ARGV[11]), tonumber(ARGV[12])
local v = redis.call('HMGET', key, 'tokens', 'leased', id, 'swept')
local t, L = cap, 0
if v[1] then
  t = tonumber(v[1])
  if t == nil then return redis.error_reply('BADDATA tokens is not a number') end
end
if v[2] then
  L = tonumber(v[2])
  if L == nil then return redis.error_reply('BADDATA leased is not a number') end
end
local r = {}
if v[3] then
  local f = {string.match(v[3], '^(%d+) (%d+) (%d+) (%d+) (%d+) (%d+) (%d+)$')}
  if #f ~= 7 then return redis.error_reply('BADDATA a process record is not numbers') end
  r.s, r.g, r.d, r.c, r.x, r.u = tonumber(f[1]), tonumber(f[2]), tonumber(f[3]), tonumber(f[4]), tonumber(f[5]), tonumber(f[6])
  if seq <= r.s then
    redis.call('HINCRBY', key, 'replayed', 1)
    return {r.g, r.d, r.c, r.x, t, math.max(0, cap - L - t)}
  end
  L = L - (r.g - r.u)
else
  r.g, r.d, r.c, r.x = gk, dk, ck, xk
  if ARGV[13] == '1' and dt > dk then
    r.x, r.d = xk + dt - dk, dt
  end
end
r.g, r.d, r.c, r.x, r.u = math.max(r.g, gk), math.max(r.d, dk), math.max(r.c, ck), math.max(r.x, xk), ut
L = L + r.g - r.u
local credit = math.min(math.max(0, dt - r.d), math.max(0, cap - L - t))
t, r.c, r.d = t + credit, r.c + credit, math.max(r.d, dt)
if need > 0 and t >= need then
  local granted = math.min(t, math.max(want, need))
  t, r.g, L = t - granted, r.g + granted, L + granted
end
if t + L > cap then t = math.max(0, cap - L) end
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
local swept = nil
if v[4] then
  local c, at = string.match(v[4], '^(%d+) (%d+)$')
  if at then swept = {c, tonumber(at)} end
end
if swept == nil or ms - swept[2] >= 10 then
  local sc = redis.call('HSCAN', key, swept and swept[1] or '0', 'COUNT', 8)
  for i = 1, #sc[2], 2 do
    local f = sc[2][i]
    if f ~= id and string.sub(f, 1, 2) == 'p:' then
      local g, u, last = string.match(sc[2][i + 1], '^%d+ (%d+) %d+ %d+ %d+ (%d+) (%d+)$')
      if last and ms - tonumber(last) > ttl then
        L = L - (tonumber(g) - tonumber(u))
        redis.call('HDEL', key, f)
      end
    end
  end
  redis.call('HSET', key, 'swept', sc[1] .. ' ' .. string.format('%.0f', ms))
end
L = math.max(0, L)
redis.call('HSET', key, 'tokens', t, 'leased', L, id,
  string.format('%.0f %.0f %.0f %.0f %.0f %.0f %.0f', seq, r.g, r.d, r.c, r.x, r.u, ms))
redis.call('PEXPIRE', key, ttl)
return {r.g, r.d, r.c, r.x, t, math.max(0, cap - L - t)}
`)

// now is the time on the budget's monotonic clock.
func (b *Budget) now() int64 { return int64(time.Since(b.epoch)) }

// jitter draws a wait between d and one and a half d: never more than one
// call per d, and a fleet's processes spread out.
func jitter(d time.Duration) int64 { return int64(d) + rand.Int64N(int64(d)/2+1) }

// Deposit counts a first-try success locally; it reaches Redis with this
// process's next call, or on its own once Recheck has passed since the
// last one. The success path never waits for Redis.
//
// A success counts only up to the room the bucket and the fleet's leases
// left at this process's last answer, plus the tokens it spent since: a
// full bucket drops deposits, as the AWS quota does, and deposits held
// back while it was full must not be added later, when the bucket has
// drained, or a fleet of processes would overshoot it together. Redis
// credits no more than the room it has either.
func (b *Budget) Deposit(success bool) {
	if b.down.Load() {
		b.fallback.Deposit(success)
		return
	}
	if !success {
		return
	}
	if b.deposits.Load()-b.seenDep.Load() < b.room.Load()+b.spent.Load() {
		b.deposits.Add(successReward)
	}
	// Deposits held at the room's limit travel too: the bucket may have
	// room again by now.
	if now := b.now(); b.deposits.Load() > b.seenDep.Load() && now >= b.next.Load() && b.mu.TryLock() {
		if b.fl == nil && now >= b.next.Load() {
			b.start(0, 0, now+int64(b.opts.Timeout)) // the deposits travel alone
		}
		b.mu.Unlock()
	}
}

// Withdraw pays for a retry from the local lease. When the lease cannot pay
// it asks Redis for a batch, sharing the call with every withdrawal of this
// process that waits at the same time, and returns within about Timeout:
// when Redis does not answer in time, or cannot be reached, the local
// fallback pays. A process that saw the bucket hold too little less than
// about Recheck ago refuses at once, without asking.
//
// The refund goes back to the lease (the fleet's tokens) or to the
// fallback, whichever paid, whatever the budget uses by the time of the
// refund. It refuses, holding nothing, when ctx has ended or ends while it
// waits for Redis, and passes ctx on to the Fallback.
func (b *Budget) Withdraw(ctx context.Context, c retryhttp.Class) (func(bool), bool) {
	if ctx.Err() != nil { // the request is gone: nothing to pay for, no call to make
		return nil, false
	}
	cost := cost(c)
	if b.takeLease(cost) {
		return b.paid(cost)
	}
	var deadline int64
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for round := 0; ; round++ {
		if round > 0 && ctx.Err() != nil {
			return nil, false
		}
		now := b.now()
		if round == 0 {
			deadline = now + int64(b.opts.Timeout)
		}
		switch {
		case b.down.Load() && now < b.downUntil.Load():
			return b.fromFallback(ctx, c)
		case b.seen.Load() < cost && now < b.next.Load():
			b.stats.refused.Add(1) // the bucket was too low a moment ago
			return nil, false
		case now >= deadline:
			// Calls answered, but others took their tokens first: this one
			// has waited its Timeout.
			return b.fromFallback(ctx, c)
		}
		b.mu.Lock()
		if b.takeLease(cost) { // a call answered meanwhile
			b.mu.Unlock()
			return b.paid(cost)
		}
		f := b.fl
		if f == nil {
			// A call gets its full Timeout; the first one this withdrawal
			// makes ends when the withdrawal's own time does.
			end := now + int64(b.opts.Timeout)
			if round == 0 {
				end = deadline
			}
			f = b.start(cost, b.waiting+cost, end)
		}
		b.waiting += cost
		b.mu.Unlock()
		if f.end <= deadline {
			select {
			case <-f.done: // it ends in time: its own timer sees to that
			case <-ctx.Done():
				b.unwait(cost)
				return nil, false
			}
		} else {
			if timer == nil {
				timer = time.NewTimer(time.Duration(deadline - b.now()))
			}
			select {
			case <-f.done:
			case <-ctx.Done():
				b.unwait(cost)
				return nil, false
			case <-timer.C:
				// A call that started after this withdrawal is still out:
				// the fallback pays for this one.
				b.unwait(cost)
				return b.fromFallback(ctx, c)
			}
		}
		b.unwait(cost)
		if b.takeLease(cost) {
			return b.paid(cost)
		}
	}
}

// start sends a call to Redis with this process's sequence number and
// totals (its deposits among them), asking for want tokens if the bucket
// holds need (none for a call that only carries deposits). The caller
// holds b.mu. The call runs on a goroutine of its own; its flight ends
// when it answers or at end, whichever comes first. Whatever becomes of
// the call, the next one carries the same totals, and Redis applies each
// call once.
func (b *Budget) start(need, want, end int64) *flight {
	if need > 0 {
		want = max(want, b.opts.Lease, need)
	}
	b.seq++
	f := &flight{done: make(chan struct{}), end: end, seq: b.seq, sent: b.now()}
	b.fl = f
	prior := 0
	if b.seq > 1 {
		prior = 1
	}
	// The tokens granted change only under b.mu, and those spent never
	// exceed them: the record's lease (granted less spent) is never
	// negative, and at most what the process holds.
	f.spent = b.spent.Load()
	args := []any{b.id, b.seq, need, want, b.capacity, b.opts.TTL.Milliseconds(),
		b.stats.taken.Load(), b.deposits.Load(), f.spent,
		b.seenDep.Load(), b.stats.credited.Load(), b.stats.dropped.Load(), prior}
	b.stats.calls.Add(1)
	wait := time.Duration(end - b.now())
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	timer := time.AfterFunc(wait, func() {
		b.land(f, nil, fmt.Errorf("%w within %v", ErrTimeout, b.opts.Timeout))
	})
	b.out.Add(1)
	go func() {
		defer b.out.Add(-1)
		defer cancel()
		// A call made during the warm-up waits for its connection rather
		// than opening a second one.
		var r []int64
		var err error
		select {
		case <-b.warmed:
			// The client may send the script again (MaxRetries, a
			// Cluster's redirects), end the call at its context's
			// deadline while Redis still runs it, or answer after the
			// flight has ended: Redis applies the call once, and an
			// answer lost is caught up by the next one.
			r, err = takeScript.Run(ctx, b.opts.Client, []string{b.key}, args...).Int64Slice()
		case <-ctx.Done():
			err = errNotSent
		}
		timer.Stop()
		if err == nil && len(r) != 6 {
			err = fmt.Errorf("redisbudget: unexpected reply %v", r)
		}
		if err != nil && isBadData(err) {
			err = fmt.Errorf("%w: %w", ErrBadData, err)
		}
		b.land(f, r, err)
	}()
	return f
}

// land ends a flight with the call's answer r (err nil) or its failure.
// The answer's totals are the record's: the tokens granted beyond those
// this process received land in the lease, even after the flight ended
// (they were granted to it, a lost answer's with them). Only the first end
// of a flight changes whether the budget uses Redis or its fallback.
func (b *Budget) land(f *flight, r []int64, err error) {
	b.mu.Lock()
	if err == nil {
		storeMax(&b.confirmed, f.sent) // before the tokens land: they are that fresh
		if g := r[0]; g > b.stats.taken.Load() {
			b.lease.Add(g - b.stats.taken.Load())
			b.stats.taken.Store(g)
		}
		storeMax(&b.seenDep, r[1])
		storeMax(&b.stats.credited, r[2])
		storeMax(&b.stats.dropped, r[3])
		if f.seq > b.answered { // an older answer, late, says less of the bucket
			b.answered = f.seq
			b.seen.Store(r[4])
			b.room.Store(r[5] - f.spent) // what this process spends since makes room too
		}
	}
	if f.over {
		b.mu.Unlock()
		return
	}
	f.over = true
	if b.fl == f {
		b.fl = nil
	}
	now := b.now()
	var report func()
	if err != nil {
		b.stats.failures.Add(1)
		report = b.fallBack(now, err)
	} else {
		b.next.Store(now + jitter(b.opts.Recheck))
		report = b.recovered()
	}
	if report != nil {
		// Reports keep the order of the changes: the next one waits for
		// this one, and the withdrawals that waited see it made.
		b.reportMu.Lock()
		b.mu.Unlock()
		func() {
			// The hook runs on the budget's goroutine: its panic would
			// take the process down, beyond any caller's recover.
			defer func() {
				if p := recover(); p != nil {
					log := b.opts.Logger
					if log == nil {
						log = slog.Default()
					}
					log.Error("redisbudget: OnFallback panicked", slog.Any("panic", p))
				}
			}()
			report()
		}()
		b.reportMu.Unlock()
	} else {
		b.mu.Unlock()
	}
	close(f.done)
}

// storeMax raises v to x if x is larger. The caller holds Budget.mu.
func storeMax(v *atomic.Int64, x int64) {
	if x > v.Load() {
		v.Store(x)
	}
}

// errNotSent is the cause of a call that timed out waiting for the warm-up.
var errNotSent = fmt.Errorf("%w: still connecting", ErrTimeout)

// paid is a payment from the lease: its refund goes back into the lease
// (the tokens were taken from the fleet's bucket, and stay the fleet's).
func (b *Budget) paid(cost int64) (func(bool), bool) {
	if cost == retryhttp.ThrottleRetryCost {
		return b.refundThrottle, true
	}
	return b.refundRetry, true
}

// leaseRefund returns the refund of cost tokens paid from the lease.
func (b *Budget) leaseRefund(cost int64) func(bool) {
	return func(bool) {
		b.lease.Add(cost)
		b.spent.Add(-cost)
		b.expireLease()
	}
}

// successReward is what a first-try success adds, as in the token bucket.
const successReward = 1

// cost is what a retry after a failure of class c takes, as in the token
// bucket.
func cost(c retryhttp.Class) int64 {
	if c == retryhttp.Throttling {
		return retryhttp.ThrottleRetryCost
	}
	return retryhttp.RetryCost
}

// unwait takes a withdrawal of cost out of the tokens wanted by those
// waiting for a call.
func (b *Budget) unwait(cost int64) {
	b.mu.Lock()
	b.waiting -= cost
	b.mu.Unlock()
}

// fromFallback is a payment from the fallback, whose refund goes back to
// it.
func (b *Budget) fromFallback(ctx context.Context, c retryhttp.Class) (func(bool), bool) {
	t, ok := b.fallback.Withdraw(ctx, c) // a fallback that waits ends with the request too
	if ok {
		b.stats.fallbackPaid.Add(1)
	}
	return t, ok
}

// takeLease takes cost tokens from the local lease if it holds them.
func (b *Budget) takeLease(cost int64) bool {
	b.expireLease()
	for {
		cur := b.lease.Load()
		if cur < cost {
			return false
		}
		if b.lease.CompareAndSwap(cur, cur-cost) {
			b.spent.Add(cost) // after: never more than the tokens granted
			return true
		}
	}
}

// expireLease drops the lease once no call of this process has answered
// for TTL: Redis may have swept its record and given the lease back to
// the bucket, whose room deposits then refill. Spending it too would let
// the lease and the bucket add up to more than Capacity. The record's time
// is at least the send time of the call that answered, so the process
// drops its lease no later than Redis may sweep it. The dropped tokens
// count as spent: the next call reports them gone.
func (b *Budget) expireLease() {
	if b.now()-b.confirmed.Load() < int64(b.opts.TTL) {
		return
	}
	for {
		cur := b.lease.Load()
		if cur <= 0 {
			return
		}
		if b.lease.CompareAndSwap(cur, 0) {
			b.spent.Add(cur) // after: never more than the tokens granted
			return
		}
	}
}

// Available reports the tokens this process holds in its lease, or the
// fallback's while Redis cannot be reached. The fleet's bucket is in Redis:
// Tokens reads it.
func (b *Budget) Available() int {
	if b.down.Load() {
		return b.fallback.Available()
	}
	b.expireLease() // a lease past its record's TTL is no longer held
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

// Stats are a Budget's counts since New.
type Stats struct {
	// Calls is how many script calls the budget sent to Redis: refills, and
	// deposits that travelled alone.
	Calls int64
	// Failures is how many of them failed or did not answer within Timeout.
	Failures int64
	// LocalRefusals is how many retries were refused without a call,
	// because this process had seen the bucket too low less than about
	// Recheck before.
	LocalRefusals int64
	// FallbackPayments is how many retries the fallback paid for.
	FallbackPayments int64
	// Taken is how many tokens this process took from the fleet's bucket
	// into its lease.
	Taken int64
	// Credited is how many deposits Redis confirmed it added, in this
	// process's record.
	Credited int64
	// Dropped is how many deposits have an unknown fate: sent in a call
	// that may have been applied to a record since lost (Redis restarted
	// without its data, or the record expired), and never confirmed.
	// Redis may have added them, to a bucket that is gone.
	Dropped int64
}

// Stats reports the budget's counts.
func (b *Budget) Stats() Stats {
	s := &b.stats
	return Stats{Calls: s.calls.Load(), Failures: s.failures.Load(), LocalRefusals: s.refused.Load(),
		FallbackPayments: s.fallbackPaid.Load(), Taken: s.taken.Load(), Credited: s.credited.Load(), Dropped: s.dropped.Load()}
}

// StoreCalls reports the calls the budget made to Redis and the retries it
// refused without one: the budget's own load on its store, as otelretry
// reads it.
func (b *Budget) StoreCalls() (calls, localRefusals int64) {
	return b.stats.calls.Load(), b.stats.refused.Load()
}

// Tokens reads the bucket this process draws from in Redis (a missing
// bucket is full). It returns within about the budget's Timeout, or when
// ctx ends, whatever the client's own timeouts: the read runs on a
// goroutine of its own, which ends with the client's read. An error after
// Timeout wraps ErrTimeout and context.DeadlineExceeded.
func (b *Budget) Tokens(parent context.Context) (int64, error) {
	ctx, cancel := context.WithTimeout(parent, b.opts.Timeout)
	defer cancel()
	type answer struct {
		v   int64
		err error
	}
	// With the client's context timeout off (go-redis's default), the
	// context never reaches the socket: the read ends at the client's
	// ReadTimeout, not at ctx's deadline.
	ch := make(chan answer, 1)
	b.out.Add(1)
	go func() {
		defer b.out.Add(-1)
		v, err := b.opts.Client.HGet(ctx, b.key, "tokens").Int64()
		ch <- answer{v, err}
	}()
	var a answer
	select {
	case a = <-ch:
	case <-ctx.Done():
		if err := parent.Err(); err != nil {
			return 0, err // the caller's context ended first
		}
		return 0, fmt.Errorf("%w within %v: %w", ErrTimeout, b.opts.Timeout, ctx.Err())
	}
	if errors.Is(a.err, redis.Nil) {
		return b.capacity, nil
	}
	return a.v, a.err
}

// ShardKey is the key of shard i of the bucket under key (Options.Shards).
// Each shard's key is a hash tag of its own, so that shards land in
// different hash slots of a Redis Cluster; braces in key become
// parentheses, so that its own hash tag does not pin every shard to one
// slot.
func ShardKey(key string, i int) string {
	return "{" + strings.NewReplacer("{", "(", "}", ")").Replace(key) + "#" + strconv.Itoa(i) + "}"
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

// fallBack switches to the local bucket for RetryAfter; for the first
// failure of a run of them it returns the report to make, outside b.mu.
func (b *Budget) fallBack(now int64, err error) func() {
	b.downUntil.Store(now + jitter(b.opts.RetryAfter))
	b.lastErr.Store(&err)
	if b.down.Swap(true) {
		return nil
	}
	return func() {
		if b.opts.Logger != nil {
			b.opts.Logger.Warn("redisbudget: Redis unreachable, using the local fallback budget",
				slog.String("key", b.key), slog.Duration("retry_after", b.opts.RetryAfter), slog.String("error", err.Error()))
		}
		if b.opts.OnFallback != nil {
			b.opts.OnFallback(err)
		}
	}
}

// recovered switches back to Redis after a call that answered; it returns
// the report to make, outside b.mu, if the budget was falling back.
func (b *Budget) recovered() func() {
	if !b.down.Swap(false) {
		return nil
	}
	return func() {
		if b.opts.Logger != nil {
			b.opts.Logger.Info("redisbudget: back on Redis", slog.String("key", b.key))
		}
		if b.opts.OnFallback != nil {
			b.opts.OnFallback(nil)
		}
	}
}
