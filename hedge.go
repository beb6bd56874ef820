package retryhttp

import (
	"context"
	"net/http"
	"time"
)

// Hedging: when an attempt has had no answer for Policy.HedgeDelay, send
// another copy and take whichever answers first ("The Tail at Scale", Dean
// and Barroso, CACM 2013; gRPC's hedging policy). A hedge is extra load at
// the moment a server is slowest, so every hedge is paid from the budget, at
// HedgeCost tokens: when one server instance is slow, hedges win, their cost
// comes back and the tail is cut; when the whole dependency is slow, hedges
// lose, nothing comes back, and the budget stops them (one hedge per
// HedgeCost first-try successes, 3.6% extra requests, once the first 500
// tokens are spent).

// HedgeCost is what a hedged copy takes from a Budget (the token bucket):
// twice a transient retry's cost, so that a dependency that is slow for
// everyone gets at most one hedge for every 28 requests once the bucket is
// drained. A hedge that wins gives its cost back.
const HedgeCost = 2 * RetryCost

// hedgeStats is what hedging did in one attempt.
type hedgeStats struct {
	sent, refused int
	won           bool
}

// hedgeable reports whether this request's attempts may be hedged: hedging
// is on, the request may be sent twice (safe), and its body, if any, can be
// had again for each copy.
func (p *Policy) hedgeable(req *http.Request, safe bool) bool {
	return p.HedgeDelay > 0 && safe &&
		(req.Body == nil || req.Body == http.NoBody || req.GetBody != nil)
}

func (p *Policy) maxHedges() int {
	if p.MaxHedges <= 0 {
		return 1
	}
	return p.MaxHedges
}

// copyResult is one copy's outcome.
type copyResult struct {
	i    int
	resp *http.Response
	err  error
}

// sendHedged makes one attempt as up to maxCopies copies: out first, then a
// hedge each time HedgeDelay passes with no acceptable answer, while the
// budget pays (MaxHedges at most). The first answer that is not a retryable
// failure wins; the other copies are canceled and their responses drained
// and closed before it returns, so no copy outlives the call. If every copy
// fails retryably, the last failure is returned for the retry logic to
// weigh. release must be called once the winning response is done with.
func (t *Transport) sendHedged(base http.RoundTripper, req, out *http.Request, maxCopies int, budget RetryBudget) (
	resp *http.Response, release func(), err error, class Class, hs hedgeStats,
) {
	p := &t.Policy
	results := make(chan copyResult, maxCopies)
	var (
		cancels  []context.CancelFunc
		costs    []int64
		inflight int
	)
	launch := func(r *http.Request, cost int64) {
		ctx, cancel := context.WithCancel(r.Context())
		cancels = append(cancels, cancel)
		costs = append(costs, cost)
		i := len(cancels) - 1
		r = r.WithContext(ctx)
		inflight++
		go func() {
			resp, err := roundTripOnce(base, r)
			results <- copyResult{i, resp, err}
		}()
	}
	launch(out, 0)
	// The timer is re-armed only after a hedge is sent: once hedging
	// stops (no copy or hedge left, or the budget refuses), it stays quiet.
	timer := time.NewTimer(p.HedgeDelay)
	defer timer.Stop()

	winner := -1
	for winner < 0 && inflight > 0 {
		select {
		case r := <-results:
			inflight--
			c := p.classify(r.resp, r.err)
			if !c.retryable() || inflight == 0 {
				winner, resp, err, class = r.i, r.resp, r.err, c
				continue
			}
			discard(r.resp, cancels[r.i]) // a retryable failure while another copy runs
		case <-timer.C:
			if len(cancels) >= maxCopies || hs.sent >= p.maxHedges() {
				continue
			}
			if t.Limiter != nil && t.Limiter.limiting.Load() {
				hs.refused++ // a throttled client sends no extra copies
				continue
			}
			cost, ok := budget.Withdraw(Hedge)
			if !ok {
				hs.refused++
				continue
			}
			hedge := nextRequest(req, out) // launch gives it a context of its own
			if hedge == nil {
				budget.Refund(cost, false)
				continue
			}
			launch(hedge, cost)
			hs.sent++
			timer.Reset(p.HedgeDelay)
		}
	}
	// Cancel the others and wait for them: their responses are drained
	// (bounded) and closed here, and no goroutine is left behind.
	for i, cancel := range cancels {
		if i != winner {
			cancel()
		}
	}
	for ; inflight > 0; inflight-- {
		r := <-results
		discard(r.resp, cancels[r.i])
	}
	if winner > 0 && !class.retryable() {
		hs.won = true
		budget.Refund(costs[winner], true) // the hedge paid for itself
	}
	release = cancels[winner]
	if resp == nil {
		release()
		release = nil
	}
	return resp, release, err, class, hs
}
