package retryhttp

import (
	"context"
	"time"

	"github.com/herdproof/retryhttp/internal/ratio"
)

// NewRatioBudget returns a Budget that lets retries be at most a share of
// recent requests, plus an allowance for quiet clients. It is the budget of
// the Google SRE book, and of Finagle, Linkerd and tower.
//
// Over any window, it allows share·requests + perSecond·window retries. A
// tenth of the window may hold at most twice its share of them, so that
// retries never come back in one burst when old ones expire. It does not
// care whether requests succeed. During an outage the load is bounded at
// about (1 + share) times the requests. The budget recovers by itself as
// old requests leave the window. A retry costs 1, whatever its class. A
// retry that was sent stays counted, successful or not: it was load.
//
// A zero, NaN or infinite share means 10%. A negative one allows no retry
// beyond perSecond. A zero, NaN or infinite perSecond means 10 a second. A
// negative one means none. A zero window means 10 s. A window under a
// millisecond is taken as one.
//
// It is safe for concurrent use and takes no lock. Two retries withdrawn at
// the same instant may both pass the check for the last one allowed. A
// request counted at the very moment its slot is reused may be lost.
func NewRatioBudget(share, perSecond float64, window time.Duration) Budget {
	return &ratioBudget{ratio.Budget{Ratio: share, PerSecond: perSecond, Window: window}}
}

// ratioBudget is NewRatioBudget's Budget.
type ratioBudget struct{ ratio.Budget }

func (b *ratioBudget) Deposit(bool) { b.Budget.Deposit() }

func (b *ratioBudget) Withdraw(context.Context, Class) (func(bool), bool) {
	slot, ok := b.Budget.Withdraw()
	if !ok {
		return nil, false
	}
	return func(sent bool) {
		if !sent {
			b.Refund(slot)
		}
	}, true
}
