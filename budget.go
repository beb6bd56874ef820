package retryhttp

import (
	"context"
	"sync/atomic"
)

// The token bucket's quota, as in the AWS SDKs' standard retry mode.
const (
	// DefaultBudgetTokens is the size of the bucket a Transport makes when
	// its Budget is nil.
	DefaultBudgetTokens = 500
	// RetryCost is what a retry after a Transient failure takes.
	RetryCost = 14
	// ThrottleRetryCost is what a retry after a Throttling failure takes.
	ThrottleRetryCost = 5
)

// successReward is what a request that succeeds on its first attempt puts
// back into a token bucket.
const successReward = 1

// A Budget decides whether a retry may be made. A client facing a sick
// dependency then stops retrying instead of multiplying the load on it.
//
// NewTokenBucket and NewRatioBudget make the two kinds this package has.
// The redisbudget module's is shared by a fleet. A Transport calls the
// methods from the goroutines that call RoundTrip, so they must be safe
// for concurrent use.
type Budget interface {
	// Deposit is called once per request, after its first attempt.
	// success reports whether that attempt succeeded. It runs on every
	// request and should cost next to nothing.
	Deposit(success bool)

	// Withdraw is called before each retry, after a failure of class c
	// (Transient or Throttling). It reports whether the retry may be
	// made. A Budget that waits, on a store a fleet shares, stops waiting
	// when ctx ends, and refuses.
	//
	// With ok, refund gives the retry back, at most once: sent is true
	// when the retry was sent and succeeded, false when it was never sent.
	// A retry that was sent and failed is not refunded. A nil refund means
	// there is nothing to give back. A refusal pays nothing.
	Withdraw(ctx context.Context, c Class) (refund func(sent bool), ok bool)

	// Available reports what the budget holds now, in its own unit. Hooks,
	// logs and metrics read it.
	Available() int
}

// NewTokenBucket returns a full token bucket of the given size. It is the
// Transport's default Budget.
//
// A retry takes RetryCost tokens, or ThrottleRetryCost after throttling.
// A retry that succeeds gives back its own cost. A retry that is never
// sent gives back its cost. A request that succeeds on its first attempt
// adds one token, never above the size. A retry the bucket cannot pay for
// is refused, and the last result is returned at once.
//
// The bucket is local to the process. Transports that share one share one
// quota. Its methods are safe for concurrent use and take no lock. A
// negative size is taken as zero: such a bucket refuses every retry.
func NewTokenBucket(tokens int) Budget { return newTokenBucket(tokens) }

func newTokenBucket(tokens int) *tokenBucket {
	b := &tokenBucket{capacity: int64(max(tokens, 0))}
	b.tokens.Store(b.capacity)
	b.refundRetry = func(bool) { b.give(RetryCost) }
	b.refundThrottle = func(bool) { b.give(ThrottleRetryCost) }
	return b
}

// tokenBucket is NewTokenBucket's Budget.
type tokenBucket struct {
	tokens   atomic.Int64
	capacity int64
	// The refunds of the two costs, made once so that a retry allocates
	// nothing.
	refundRetry, refundThrottle func(bool)
}

func (b *tokenBucket) Available() int { return int(b.tokens.Load()) }

func (b *tokenBucket) Deposit(success bool) {
	if success {
		b.give(successReward) // only reads when the bucket is full
	}
}

func (b *tokenBucket) Withdraw(_ context.Context, c Class) (func(bool), bool) {
	if !b.take(c.cost()) {
		return nil, false
	}
	if c == Throttling {
		return b.refundThrottle, true
	}
	return b.refundRetry, true
}

// take removes cost tokens if the bucket holds that many and reports
// whether it did.
func (b *tokenBucket) take(cost int64) bool {
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

// give adds n tokens, never above capacity. A full bucket is only read,
// never written. So a healthy client's success path does not bounce the
// bucket's cache line between cores.
func (b *tokenBucket) give(n int64) {
	for {
		cur := b.tokens.Load()
		if cur >= b.capacity {
			return
		}
		// cur+n may overflow near the largest capacities. capacity-cur
		// cannot, since 0 <= cur < capacity.
		if b.tokens.CompareAndSwap(cur, cur+min(n, b.capacity-cur)) {
			return
		}
	}
}

// cost is what a token bucket charges for a retry after a failure of class
// c.
func (c Class) cost() int64 {
	if c == Throttling {
		return ThrottleRetryCost
	}
	return RetryCost
}
