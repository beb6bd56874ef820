package retryhttp

import (
	"context"
	"math"
	"sync/atomic"
)

// Default costs of the retry quota, as in the AWS SDKs' standard retry mode.
const (
	// DefaultBudgetTokens is the size of the bucket a Transport makes for
	// itself when its Budget is nil.
	DefaultBudgetTokens = 500
	// RetryCost is what a retry after a transient failure (502, 503, 504, a
	// network error) takes from the bucket.
	RetryCost = 14
	// ThrottleRetryCost is what a retry after a throttling response (429)
	// takes from the bucket.
	ThrottleRetryCost = 5
	// SuccessReward is what a request that succeeds on its first attempt
	// puts back, never above the bucket's capacity.
	SuccessReward = 1
)

// A RetryBudget decides whether a retry may be made, so that a client facing a
// sick dependency stops retrying instead of multiplying the load on it. The
// Transport's Budget field takes any implementation: *Budget (the AWS SDKs'
// token bucket, the default), *RatioBudget (retries as a share of recent
// requests), or one of your own, such as a budget a whole fleet shares
// (the redisbudget module).
//
// The Transport calls the methods from the goroutines that call RoundTrip,
// so they must be safe for concurrent use; Deposit runs on every request and
// should cost next to nothing.
type RetryBudget interface {
	// Deposit is called once per request, after its first attempt;
	// success reports whether that attempt succeeded.
	Deposit(success bool)
	// Withdraw is called before each retry, after a failure of class c
	// (Transient or Throttling). It reports whether the retry may be made
	// and, if so, the Tokens it paid, which the Transport settles exactly
	// once (see Tokens).
	Withdraw(c Class) (t Tokens, ok bool)
	// Available reports what the budget holds now, in its own unit, for
	// hooks, logs and metrics.
	Available() int
}

// A ContextBudget is a RetryBudget whose withdrawals may wait, on a store a
// fleet shares, say. The Transport calls WithdrawContext in place of
// Withdraw, with the request's context, so that a slow store cannot hold a
// request past its deadline or its caller's cancellation.
type ContextBudget interface {
	RetryBudget
	// WithdrawContext is Withdraw for a request whose context may end
	// first: when ctx ends before the budget decides, it refuses and holds
	// nothing. The Transport ends the request if ctx ended, whatever was
	// returned, and gives back any Tokens paid.
	WithdrawContext(ctx context.Context, c Class) (t Tokens, ok bool)
}

// withdraw asks b for a retry of class c, with ctx if b is a ContextBudget.
func withdraw(ctx context.Context, b RetryBudget, c Class) (Tokens, bool) {
	if cb, ok := b.(ContextBudget); ok {
		return cb.WithdrawContext(ctx, c)
	}
	return b.Withdraw(c)
}

// Tokens are what a RetryBudget paid for one retry. The
// Transport holds them from the decision to retry until the retry's fate is
// known, then settles them exactly once: it gives them back to their Payer
// when the retry was never sent (its wait was canceled, its body could not
// be had again, a hook panicked, no send permit came) or when it succeeded
// and otherwise keeps them spent. The refund goes to
// whoever paid, not to whoever pays now: a budget that switches between
// sources (a fleet budget and its local fallback) names the source in Payer.
type Tokens struct {
	// Cost is what was taken, in the payer's unit.
	Cost int64
	// Payer takes the tokens back on a refund. Nil means there is nothing
	// to give back.
	Payer Payer
	// Mark is the payer's own note about the payment, such as the time
	// slot that counted it; the Transport carries it unread.
	Mark uint64
}

// A Payer takes back Tokens it paid. Refund is called at most once for each
// payment: sent is true when the retry was sent and succeeded, false when it
// was never sent. A retry that was sent and failed is
// never refunded.
type Payer interface {
	Refund(t Tokens, sent bool)
}

// refund gives the tokens back to their payer, once: it empties t.
func (t *Tokens) refund(sent bool) {
	if p := t.Payer; p != nil {
		paid := *t
		*t = Tokens{}
		p.Refund(paid, sent)
	}
}

// spend keeps the tokens spent: the retry was sent and did not succeed. It
// empties t.
func (t *Tokens) spend() { *t = Tokens{} }

// A Budget is a token bucket that pays for retries, so that a client facing a
// sick dependency stops retrying instead of multiplying the load on it.
//
// Each retry takes RetryCost (14) or, after a throttling failure,
// ThrottleRetryCost (5) tokens before it is made. A retry that succeeds gives
// back its own cost only: the tokens of earlier retries of the same request
// that failed stay spent. A retry that is never sent (its wait canceled, its
// body not to be had) gives its cost back. A request that succeeds on its
// first attempt adds SuccessReward (1), never above the capacity. When the
// bucket holds less than a retry's cost, the Transport returns the last
// result at once, with no wait. With three attempts the bucket only drains
// when about 21% of attempts fail transiently (32% under throttling), so
// healthy traffic never notices it; during a full outage a full bucket of
// 500 pays for 35 transient retries (500/14), then every request makes one
// attempt until first-try successes refill it.
//
// A Budget is local to the process: sharing one between Transports makes them
// share one quota, but it bounds nothing across a fleet. Its methods are safe
// for concurrent use and lock-free. Make one with NewBudget or
// UnlimitedBudget; the zero Budget holds no tokens and refuses every retry.
// It implements RetryBudget and Payer.
type Budget struct {
	tokens    atomic.Int64
	capacity  int64
	unlimited bool
}

// NewBudget returns a full bucket of the given number of tokens. A negative
// number is taken as zero: such a budget refuses every retry.
func NewBudget(tokens int) *Budget {
	b := &Budget{capacity: int64(max(tokens, 0))}
	b.tokens.Store(b.capacity)
	return b
}

// UnlimitedBudget returns a Budget that never refuses a retry. It exists for
// simulations and for layered setups that bound retries some other way; a
// production client should keep a finite budget.
func UnlimitedBudget() *Budget {
	return &Budget{capacity: math.MaxInt64, unlimited: true}
}

// Available reports the tokens in the bucket now. An unlimited budget
// reports math.MaxInt.
func (b *Budget) Available() int {
	if b.unlimited {
		return math.MaxInt
	}
	return int(b.tokens.Load())
}

// Capacity reports the most tokens the bucket holds.
func (b *Budget) Capacity() int {
	if b.unlimited {
		return math.MaxInt
	}
	return int(b.capacity)
}

// Deposit adds SuccessReward when the request's first attempt succeeded.
func (b *Budget) Deposit(success bool) {
	if success {
		b.give(SuccessReward) // only reads when the bucket is full
	}
}

// Withdraw takes c.Cost() tokens, if the bucket holds them.
func (b *Budget) Withdraw(c Class) (Tokens, bool) {
	cost := c.Cost()
	if !b.take(cost) {
		return Tokens{}, false
	}
	return Tokens{Cost: cost, Payer: b}, true
}

// Refund gives the tokens back, whether the retry succeeded or was never
// sent.
func (b *Budget) Refund(t Tokens, sent bool) { b.give(t.Cost) }

// take removes cost tokens if the bucket holds that many and reports whether
// it did.
func (b *Budget) take(cost int64) bool {
	if b.unlimited {
		return true
	}
	for {
		cur := b.tokens.Load()
		if cur < cost {
			return false
		}
		if b.tokens.CompareAndSwap(cur, cur-cost) {
			return true
		}
	}
}

// give adds n tokens, never above capacity. A full bucket is only read, never
// written, so the success path of a healthy client does not bounce the
// bucket's cache line between cores.
func (b *Budget) give(n int64) {
	if b.unlimited {
		return
	}
	for {
		cur := b.tokens.Load()
		if cur >= b.capacity {
			return
		}
		// cur+n may overflow near the largest capacities; capacity-cur
		// cannot (0 <= cur < capacity).
		if b.tokens.CompareAndSwap(cur, cur+min(n, b.capacity-cur)) {
			return
		}
	}
}

// Cost is what the token bucket charges for a retry after a failure of class
// c: RetryCost, or ThrottleRetryCost after throttling. Budgets of other
// kinds that keep tokens, such as the redisbudget module's, charge the
// same.
func (c Class) Cost() int64 {
	if c == Throttling {
		return ThrottleRetryCost
	}
	return RetryCost
}
