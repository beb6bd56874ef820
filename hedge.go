package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"sync"
	"time"
)

// Hedging: when an attempt has had no answer for the hedge delay, send
// another copy and take whichever answers first. The idea comes from "The
// Tail at Scale" (Dean and Barroso, CACM 2013) and gRPC's hedging policy.
//
// A hedge is extra load at the moment a server is slowest. So hedges are
// at most a share of requests: Policy.HedgeRatio, or defaultHedgeRatio. A
// dependency slow for everyone gets that share in extra copies, no more.
//
// Hedges are not paid from the retry budget. A hedge that loses would
// spend tokens meant for failures. A budget short of tokens would refuse
// hedges at random, the ones that cut the tail among them.
//
// A hedge the share cannot pay for now is asked for again after a quarter
// of the delay. The first ask of an attempt leaves 1 - HedgeRatio of a
// hedge in the share, for the asks that come again. So when the share runs
// short, the slowest copies get the hedges first. Most copies just past the
// delay answer in a moment anyway.

// hedgeStats is what hedging did in one attempt.
type hedgeStats struct {
	sent, refused int32
	won           bool
}

// hedgeable reports whether this request's attempts may be hedged. Hedging
// must be on and the method idempotent. The body, if any, must be one that
// can be had again for each copy.
//
// A write is not hedged, even with an idempotency key. A server that
// deduplicates keys answers a copy that comes during another with 409
// Conflict (the IETF Idempotency-Key draft; Stripe). That answer would win
// the race while the write is still being done.
func (p *Policy) hedgeable(req *http.Request) bool {
	return (p.HedgeDelay > 0 || p.hedgeQuantile() > 0) && idempotentMethod(req.Method) &&
		(req.Body == nil || req.Body == http.NoBody || req.GetBody != nil)
}

// hedgeQuantile is HedgeQuantile, or 0 when it is not a quantile.
func (p *Policy) hedgeQuantile() float64 {
	if p.HedgeQuantile > 0 && p.HedgeQuantile < 1 {
		return p.HedgeQuantile
	}
	return 0
}

func (p *Policy) hedgeRatio() float64 {
	if !(p.HedgeRatio > 0) || math.IsInf(p.HedgeRatio, 1) { // NaN too
		return defaultHedgeRatio
	}
	return min(p.HedgeRatio, hedgeBurst)
}

// hedgeDelay is how long an attempt waits before its first hedge, or 0 for
// no hedge. It is the fixed HedgeDelay without HedgeQuantile. With it, it
// is the running quantile, never below HedgeDelay, and 0 until one is known.
func (c *call) hedgeDelay() time.Duration {
	p := &c.t.Policy
	if p.hedgeQuantile() == 0 {
		return p.HedgeDelay
	}
	if est := c.hs.lat.estimate(); est > 0 {
		return max(est, p.HedgeDelay)
	}
	return 0
}

// hedgeCap bounds Policy.MaxHedges. The copies of one attempt answer into a
// channel with room for them all.
const hedgeCap = 100

func (p *Policy) maxHedges() int {
	if p.MaxHedges <= 0 {
		return 1
	}
	return min(p.MaxHedges, hedgeCap)
}

// A race is one hedged attempt: its copies and the answers they send back.
// The call owns it while it listens. The race is over once a winner is
// chosen, or a hook panics. The copies still running are then canceled.
// Each discards its own answer when it comes. So the winner never waits for
// a loser whose base ignores cancellation.
type race struct {
	answers chan copyAnswer // buffered for every copy: none ever blocks
	mu      sync.Mutex
	over    bool
	copies  []hedgeCopy // appended by the call under mu
	buf     [2]hedgeCopy
	next    hedgeCopy     // a hedge being prepared: its permit and its share
	pol     *Policy       // for the delay a late 429 asks the Limiter for
	timeout time.Duration // AttemptTimeout, for each copy; 0 for none
	report  *Report       // the caller's, which each answer's Report joins; nil for none
	failed  failure       // the retryable failure kept while copies run; only the call touches it

	// For an automatic delay, the first copy's latency is measured. It runs
	// up to its answer, or up to the end of the race when a hedge won: the
	// copy took at least that long. Counting the hedges that win, and not
	// the copies they beat, would pull the delay below the quantile.
	lat      *latency // nil when not measured
	qs       quantiles
	censor   bool // a first copy cut by its timeout is counted as censored
	own      bool // a first copy cut by the Override's timeout is not counted
	start    time.Time
	ctx      context.Context // the request's: a copy the caller canceled is not measured
	answered bool            // the first copy's answer came in the race; under mu
}

// errCopyCanceled is the cause a copy is canceled with once its race is
// over. The winner is canceled with it once its body is closed. A base may
// fail another request on the copy's connection with it (see
// call.classify). A request that gets this error was not canceled by its
// caller.
var errCopyCanceled = fmt.Errorf("retryhttp: a hedged copy's race is over: %w", context.Canceled)

// A hedgeCopy is what one copy holds: its cancel, its send permit and its
// own Report. It holds the hedge it took from the share until it is sent.
// Its timer, under AttemptTimeout, cancels it.
type hedgeCopy struct {
	cancel context.CancelFunc
	permit permit
	quota  *hedgeQuota
	report *Report
	timer  *time.Timer
}

// A copyAnswer is what one copy came back with. A copy whose base
// panicked answers with the panic's value, for the call to panic with on
// the caller's goroutine.
type copyAnswer struct {
	i        int
	resp     *http.Response
	err      error
	panicked bool
	value    any // the panic's
}

// launch sends req as the next copy on a goroutine of its own. An answer
// that comes once the race is over is discarded by the copy itself. A 429
// in it still reaches the limiter.
func (r *race) launch(base http.RoundTripper, req *http.Request, hc hedgeCopy) {
	ctx, cancel := context.WithCancelCause(req.Context())
	if hc.report != nil {
		ctx = WithReport(ctx, hc.report)
	}
	// sent: its share is spent
	hc.cancel, hc.quota = func() { cancel(errCopyCanceled) }, nil
	if r.timeout > 0 {
		hc.timer = time.AfterFunc(r.timeout, hc.cancel)
	}
	r.mu.Lock()
	i := len(r.copies)
	r.copies = append(r.copies, hc)
	r.mu.Unlock()
	// A deep copy: a copy that loses may still run after RoundTrip returns.
	// Once the caller has closed the response body, it may change or reuse
	// its request, as the RoundTripper contract allows.
	req = req.Clone(ctx)
	go r.run(base, req, i, hc)
}

// run sends copy i on its own goroutine. A panic in the base is recovered
// here, where it would crash the process, and answered.
func (r *race) run(base http.RoundTripper, req *http.Request, i int, hc hedgeCopy) {
	a := copyAnswer{i: i, panicked: true}
	defer r.answer(&a, hc) // on a panic too
	a.resp, a.err = roundTripOnce(base, req)
	a.panicked = false
}

// answer sends copy a's answer to the race, or disposes of it once the race
// is over. As run's deferred call, it recovers the base's panic. The call
// then panics with its value on the caller's goroutine, as without hedging.
// A panic after the race is over has no caller to reach: it ends only its
// copy. A base that exits its goroutine (runtime.Goexit) fails the copy
// with errBaseExited.
func (r *race) answer(a *copyAnswer, hc hedgeCopy) {
	if a.panicked {
		if a.value = recover(); a.value == nil {
			a.panicked, a.err = false, errBaseExited
		}
	}
	r.mu.Lock()
	if !r.over {
		if a.i == 0 && r.lat != nil && !a.panicked && r.ctx.Err() == nil {
			// A first copy that failed once its timeout passed was cut by it.
			d, cut := time.Since(r.start), time.Duration(0)
			if a.err != nil && r.timeout > 0 && d >= r.timeout {
				cut = r.timeout
			}
			r.lat.attempt(d, cut, r.censor, r.own, r.qs)
			r.answered = true
		}
		r.answers <- *a
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	if a.panicked {
		a.err = fmt.Errorf("retryhttp: base RoundTripper panicked: %v", a.value)
	}
	lateAnswer(r.pol, a.resp, a.err, hc)
}

// errBaseExited is the error of a hedged copy whose base called
// runtime.Goexit, so that the race does not wait for it forever.
var errBaseExited = errors.New("retryhttp: base RoundTripper exited its goroutine without returning")

// lateAnswer disposes of an answer that nobody listens for any more. It
// drains it on a goroutine of its own, so that the winner never waits for a
// loser. The answer reaches the limiter all the same. It is classified by
// its status alone, since no hook runs off the caller's goroutine. A 429 is
// a throttle; anything else is an answer that got through.
func lateAnswer(pol *Policy, resp *http.Response, err error, hc hedgeCopy) {
	class := Success
	if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
		class = Throttling
	}
	hc.permit.answered(pol, resp, err, class)
	go discard(resp, hc.cancel)
}

// end closes the race. Every copy but the winner (-1 for none) is canceled.
// The answers already sent are discarded. A hedge being prepared gives back
// its share and its permit: it was not sent.
func (r *race) end(winner int) {
	r.mu.Lock()
	r.over = true
	beaten := r.lat != nil && !r.answered && winner > 0 && r.ctx.Err() == nil
	r.mu.Unlock()
	if beaten {
		r.lat.measure(time.Since(r.start), r.qs)
	}
	for i := range r.copies {
		if t := r.copies[i].timer; t != nil {
			t.Stop()
		}
		if i != winner {
			r.copies[i].cancel()
		}
	}
	r.failed.discard()
	for {
		select {
		case a := <-r.answers:
			r.report.merge(r.copies[a.i].report) // it came before the end: its attempts were made
			lateAnswer(r.pol, a.resp, a.err, r.copies[a.i])
		default:
			r.next.giveBack()
			return
		}
	}
}

// giveBack returns what a hedge prepared and not sent holds.
func (hc *hedgeCopy) giveBack() {
	if hc.quota != nil {
		hc.quota.refund()
	}
	hc.permit.cancel()
	*hc = hedgeCopy{}
}

// A failure is a copy's retryable failure, kept by the race while other
// copies may still win. Its answer already reached the limiter.
type failure struct {
	i       int
	resp    *http.Response
	err     error
	release func() // the copy's cancel; nil for no failure kept
	class   Class
}

// discard disposes of a failure kept, if any, and empties f.
func (f *failure) discard() {
	if f.release != nil {
		go discard(f.resp, f.release)
	}
	*f = failure{}
}

// abandon ends a race that a panicking hook left running.
func (r *race) abandon() { r.end(-1) }

// sendHedged makes one attempt as up to maxCopies copies. The first is sent
// at once. A hedge follows each time delay passes with no acceptable
// answer, MaxHedges at most. A hedge needs one from the hedge share and a
// permit due now from the Limiter. Without either, it is asked for again
// after a quarter of the delay. No hedge is sent once the request's context
// is done, nor, with Policy.PropagateDeadline, one that the measured
// latency says cannot end in time.
//
// The first answer that is not a retryable failure wins. The other copies
// are canceled and discarded without being waited for. If every copy fails
// retryably, the last throttle is the attempt's outcome, for the retry
// logic to weigh. Without a throttle, the last failure is. A copy's 429 is
// the server asking the retry to slow down, whatever its hedge got.
//
// Each copy is bounded by AttemptTimeout, as an attempt that is not hedged
// is (see sendTimed). A copy that runs out is a retryable failure like any
// other, and its hedges run on.
//
// A hedge counts as won only while the caller's context is alive. Every
// copy's 429 reaches the Limiter. Each copy carries its own attempt number.
// Each records into a Report of its own, since it runs on a goroutine of
// its own. A Transport inside the base must not write into the caller's
// Report from there. The Report of each copy that answered before the race
// ended joins the caller's, in the order they answered. A copy still
// running then keeps its attempts to itself.
func (c *call) sendHedged(delay time.Duration) {
	o, p := &c.o, &c.t.Policy
	maxCopies := min(c.max-o.number+1, p.maxHedges()+1)
	r := &race{answers: make(chan copyAnswer, maxCopies), pol: p, timeout: c.attemptTimeout(), report: c.report}
	r.copies = r.buf[:0]
	c.race = r
	base := c.t.base()
	if c.measured {
		r.lat, r.qs, r.censor, r.own = &c.hs.lat, p.quantiles(), c.timeoutMeasured(), c.ownTimeout()
		r.start, r.ctx = time.Now(), o.sent.Context()
	}
	r.launch(base, o.sent, hedgeCopy{permit: c.take(), report: c.copyReport()})
	// The timer runs while a hedge may still come: once no copy or hedge
	// is left, it stays quiet.
	timer := time.NewTimer(delay)
	defer timer.Stop()

	winner, inflight := -1, 1
	for winner < 0 && inflight > 0 {
		select {
		case a := <-r.answers:
			inflight--
			c.report.merge(r.copies[a.i].report) // the copy's base has returned: its Report is complete
			if a.panicked {
				// As without hedging: the panic reaches the caller, and
				// cleanup ends the race (c.race), which releases the copy.
				panic(a.value)
			}
			hc := &r.copies[a.i] // only the call appends
			o.resp, o.err = a.resp, a.err
			o.release = hc.cancel
			o.class = c.classify(a.resp, a.err)
			// As in sendTimed, the copy's timer runs through the
			// classification. If it fired while the request's context
			// lives, the copy failed with ErrAttemptTimeout.
			if hc.timer != nil && !hc.timer.Stop() && c.ctx.Err() == nil {
				if o.resp != nil {
					go discard(o.resp, nil)
				}
				o.resp, o.err = nil, fmt.Errorf("%w after %v", ErrAttemptTimeout, r.timeout)
				o.class = p.classify(nil, o.err)
			}
			hc.permit.answered(p, o.resp, o.err, o.class)
			if !o.class.retryable() {
				winner = a.i
				continue
			}
			// A retryable failure while another copy may still win: the
			// race keeps it, unless it keeps a throttle and this is not one.
			if f := &r.failed; f.release != nil && f.class == Throttling && o.class != Throttling {
				go discard(o.resp, o.release)
			} else {
				f.discard()
				*f = failure{a.i, o.resp, o.err, o.release, o.class}
			}
			o.resp, o.err, o.release = nil, nil, nil
			if inflight == 0 {
				f := r.failed
				r.failed = failure{}
				o.resp, o.err, o.release, o.class = f.resp, f.err, f.release, f.class
				winner = f.i
			}
		case <-timer.C:
			if len(r.copies) >= maxCopies || int(o.hedges.sent) >= p.maxHedges() || o.sent.Context().Err() != nil ||
				(p.PropagateDeadline && c.tooLate(0)) {
				continue // no hedge after the caller gave up, nor one that cannot end in time: the timer stays quiet
			}
			next := delay
			req, ok := c.hedge(r, o.number+len(r.copies), o.hedges.refused > 0)
			if ok {
				hc := r.next
				r.next = hedgeCopy{}
				r.launch(base, req, hc)
				o.hedges.sent++
				inflight++
			} else {
				o.hedges.refused++
				next = max(delay/4, time.Millisecond) // asked again soon: the share refills as requests come
			}
			timer.Reset(next)
		}
	}
	r.end(winner)
	c.race = nil
	o.hedges.won = winner > 0 && !o.class.retryable() && c.ctx.Err() == nil
	if o.hedges.won {
		c.hs.quota.refund() // it cut the tail, and its loser was canceled: the share pays for another
	}
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

// hedge prepares, in r.next, the hedged copy that would be attempt number
// n. It takes a hedge from the share, then a permit due now from the
// Limiter. Then it makes the copy's request, with a fresh body and its own
// attempt number. A first ask leaves 1 - HedgeRatio of a hedge in the
// share. An ask that comes again may take the last one. It reports false,
// holding nothing, when any of them cannot be had. Until the copy is
// launched, the race holds the share and the permit. So a panicking GetBody
// leaves neither taken.
func (c *call) hedge(r *race, n int, again bool) (*http.Request, bool) {
	hc := &r.next
	var keep int64
	if ratio := c.t.Policy.hedgeRatio(); !again && ratio < 1 {
		keep = int64((1-ratio)*hedgeUnit + 0.5)
	}
	if !c.hs.quota.take(keep) {
		return nil, false
	}
	hc.quota = &c.hs.quota
	if c.lim != nil {
		var ok bool
		now := time.Now()
		if hc.permit, ok = c.lim.reserve(now, now, 0, false); !ok {
			hc.giveBack() // a throttled client sends no extra copies
			return nil, false
		}
	}
	req := nextRequest(c.req, c.out)
	if req == nil {
		hc.giveBack()
		return nil, false
	}
	req = c.stamp(req, n)
	hc.report = c.copyReport()
	return req, true
}
