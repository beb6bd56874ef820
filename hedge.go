package retryhttp

import (
	"context"
	"net/http"
	"sync"
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

// A race is one hedged attempt: its copies and the answers they send back.
// The call owns it while it listens; once a winner is chosen (or a hook
// panics) the race is over, the copies still running are canceled, and each
// discards its own answer when it comes, so that the winner never waits for
// a loser whose base ignores cancellation.
type race struct {
	answers chan copyAnswer // buffered for every copy: none ever blocks
	mu      sync.Mutex
	over    bool
	copies  []hedgeCopy // appended by the call under mu
	buf     [2]hedgeCopy
	next    hedgeCopy // a hedge being prepared: its permit and tokens
}

// A hedgeCopy is what one copy holds: its context's cancel, its send permit,
// the tokens it was paid with, and its own Report.
type hedgeCopy struct {
	cancel context.CancelFunc
	permit permit
	tokens Tokens
	report *Report
}

// A copyAnswer is what one copy came back with.
type copyAnswer struct {
	i    int
	resp *http.Response
	err  error
}

// launch sends req as the next copy on a goroutine of its own. An answer
// that comes once the race is over is discarded by the copy itself; a 429
// in it still reaches the limiter.
func (r *race) launch(base http.RoundTripper, req *http.Request, hc hedgeCopy) {
	ctx, cancel := context.WithCancel(req.Context())
	if hc.report != nil {
		ctx = WithReport(ctx, hc.report)
	}
	hc.cancel = cancel
	r.mu.Lock()
	i := len(r.copies)
	r.copies = append(r.copies, hc)
	r.mu.Unlock()
	req = req.WithContext(ctx)
	go func() {
		resp, err := roundTripOnce(base, req)
		r.mu.Lock()
		if !r.over {
			r.answers <- copyAnswer{i, resp, err}
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		lateAnswer(resp, hc)
	}()
}

// lateAnswer disposes of an answer that nobody listens for any more, on a
// goroutine of its own, so that the winner never waits for a loser's drain.
// Its class is read from the status alone (no hook runs off the caller's
// goroutine): a 429 is a throttle for the limiter all the same.
func lateAnswer(resp *http.Response, hc hedgeCopy) {
	if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
		hc.permit.throttled(time.Now())
	}
	go discard(resp, hc.cancel)
}

// end closes the race: every copy but the winner (-1 for none) is canceled,
// and the answers already sent are discarded. A hedge being prepared gives
// back its tokens and permit: it was not sent.
func (r *race) end(winner int) {
	r.mu.Lock()
	r.over = true
	r.mu.Unlock()
	for i := range r.copies {
		if i != winner {
			r.copies[i].cancel()
		}
	}
	for {
		select {
		case a := <-r.answers:
			lateAnswer(a.resp, r.copies[a.i])
		default:
			r.next.tokens.refund(false)
			r.next.permit.cancel()
			return
		}
	}
}

// abandon ends a race that a panicking hook left running.
func (r *race) abandon() { r.end(-1) }

// sendHedged makes one attempt as up to maxCopies copies: the first at once,
// then a hedge each time HedgeDelay passes with no acceptable answer, while
// the Limiter has a permit due and the budget pays (MaxHedges at most). The
// first answer that is not a retryable failure wins; if every copy fails
// retryably, the last failure is the attempt's outcome, for the retry logic
// to weigh. The others are canceled and discarded without being waited for.
//
// A hedge that wins gives its tokens back, unless the caller's context has
// ended (a copy canceled by the caller won nothing); the others were sent,
// and stay spent. Every copy's 429 reaches the Limiter. Each copy carries
// its own attempt number, and records into a Report of its own, of which
// only the winner's is kept: copies run on goroutines of their own, and a
// Transport inside the base must not write into the caller's Report from
// them.
func (c *call) sendHedged() {
	o, p := &c.o, &c.t.Policy
	o.hedges = hedgeStats{}
	maxCopies := min(c.max-o.number+1, p.maxHedges()+1)
	r := &race{answers: make(chan copyAnswer, maxCopies)}
	r.copies = r.buf[:0]
	c.race = r
	base := c.t.base()
	r.launch(base, o.sent, hedgeCopy{permit: c.take(), report: c.copyReport()})
	// The timer is re-armed only after a hedge is sent: once hedging
	// stops (no copy or hedge left, or a hedge refused), it stays quiet.
	timer := time.NewTimer(p.HedgeDelay)
	defer timer.Stop()

	winner, inflight := -1, 1
	for winner < 0 && inflight > 0 {
		select {
		case a := <-r.answers:
			inflight--
			o.resp, o.err = a.resp, a.err
			o.release = r.copies[a.i].cancel // only the call appends
			o.class = p.classify(a.resp, a.err)
			if o.class == Throttling {
				r.copies[a.i].permit.throttled(time.Now())
			}
			if !o.class.retryable() || inflight == 0 {
				winner = a.i
				continue
			}
			go discard(o.resp, o.release) // a retryable failure while another copy runs
			o.resp, o.release = nil, nil
		case <-timer.C:
			if len(r.copies) >= maxCopies || o.hedges.sent >= p.maxHedges() {
				continue
			}
			req, ok := c.hedge(r, o.number+len(r.copies))
			if !ok {
				o.hedges.refused++
				continue
			}
			hc := r.next
			r.next = hedgeCopy{}
			r.launch(base, req, hc)
			o.hedges.sent++
			inflight++
			timer.Reset(p.HedgeDelay)
		}
	}
	r.end(winner)
	c.race = nil
	for i := range r.copies {
		if i == winner && i > 0 && !o.class.retryable() && c.ctx.Err() == nil {
			o.hedges.won = true
			r.copies[i].tokens.refund(true) // the hedge paid for itself
		} else {
			r.copies[i].tokens.spend()
		}
	}
	c.report.merge(r.copies[winner].report)
	if o.resp == nil && o.release != nil {
		o.release()
		o.release = nil
	}
}

// copyReport is the Report a copy records into, when the caller has one.
func (c *call) copyReport() *Report {
	if c.report == nil {
		return nil
	}
	return new(Report)
}

// hedge prepares the hedged copy that would be attempt number n, in r.next:
// a permit due now from the Limiter, its tokens from the budget, then its
// request (a fresh body, its own attempt number). It reports false, holding
// nothing, when any of them cannot be had; until the copy is launched, the
// race holds the permit and the tokens, so that a panicking GetBody leaves
// neither taken.
func (c *call) hedge(r *race, n int) (*http.Request, bool) {
	hc := &r.next
	if c.lim != nil {
		var ok bool
		if hc.permit, ok = c.lim.tryAcquire(time.Now()); !ok {
			return nil, false // a throttled client sends no extra copies
		}
	}
	tk, ok := c.budget().Withdraw(Hedge)
	if !ok {
		hc.permit.cancel()
		return nil, false
	}
	hc.tokens = tk
	req := nextRequest(c.req, c.out)
	if req == nil {
		hc.tokens.refund(false)
		hc.permit.cancel()
		return nil, false
	}
	if c.t.Policy.SendAttemptHeader {
		req = withAttemptHeader(req, n)
	}
	hc.report = c.copyReport()
	return req, true
}
