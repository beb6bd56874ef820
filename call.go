package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// A call is one RoundTrip's state, and the only owner of what the request
// holds across its attempts. RoundTrip's loop runs its steps in order:
// acquire a send permit, send, decide, observe, then finish or wait.
//
// Whatever the call holds sits in one of its fields until a step hands it
// on. A request body goes to the base. A response goes to the caller, with
// its attempt and Timeout. A retry's tokens go back to their payer, a
// permit to the attempt that uses it. cleanup, deferred once before
// anything is taken, releases what is left on every way out. A panicking
// hook's way out is one, so no step needs a cleanup of its own.
type call struct {
	t      *Transport
	req    *http.Request      // the caller's, never modified
	ctx    context.Context    // req's context, under Policy.Timeout
	cancel context.CancelFunc // Policy.Timeout's; nil without one
	report *Report
	ov     *Override    // the request's, if any
	dest   *host        // its destination's budget and limiter, with PerHost
	lim    *RateLimiter // its send permits come from, if any
	hs     *hedging     // its hedge share and latencies, when hedged or measured
	max    int          // attempts allowed

	safe      bool      // may be sent twice: idempotent, or keyed
	hedged    bool      // its attempts are hedged
	measured  bool      // its attempts' latencies are measured (Policy.measures)
	strayOK   bool      // a context.Canceled may be a stray one: the last attempt's was not
	observing bool      // a hook, a Logger or a Report reads the attempts
	began     time.Time // when RoundTrip was called, for OnEnd and the Report

	out       *http.Request // what the next attempt sends
	n         int           // attempts made, hedged copies included
	prevDelay time.Duration // the last wait, for DecorrelatedJitter

	o outcome // the last attempt's
	v verdict // the decision after it

	// Held until handed on; cleanup releases what is left. Once the
	// response has gone to the caller (done), nothing is.
	done   bool
	unsent bool       // out's body, not yet handed to the base
	sent   bool       // the retry paid for went to the base
	paid   func(bool) // the planned or running retry's refund
	permit permit     // the next attempt's
	race   *race      // a hedged attempt's copies
}

// An outcome is what one attempt came back with.
type outcome struct {
	sent       *http.Request // as sent (the first copy's, when hedged)
	number     int           // the attempt's (its first copy's, when hedged)
	resp       *http.Response
	err        error
	release    func()        // ends the attempt's own context
	timer      *time.Timer   // Policy.AttemptTimeout's, while it runs
	stretch    *stretch      // timer's, under a measured timeout
	cut        time.Duration // the attempt timeout that cut it, or 0
	permitWait time.Duration
	start      time.Time // when observing
	hedges     hedgeStats
	class      Class
	retrying   Class // the class of the failure it retries; Success for the first
}

// A verdict is the decision made after an attempt.
type verdict struct {
	delay    time.Duration
	decision Decision
	server   bool // the response asked for delay
	late     bool // StopDeadline: the attempt after the wait would not end in time
}

// refund gives the planned retry back to the budget that paid for it, once.
func (c *call) refund(sent bool) {
	if f := c.paid; f != nil {
		c.paid = nil
		f(sent)
	}
}

// start sets the call up for its request, or returns the error that ends it
// before any attempt (a context already done).
func (c *call) start(t *Transport, req *http.Request) error {
	c.t, c.req, c.out, c.unsent = t, req, req, true
	c.ctx = req.Context()
	rv := requestFrom(c.ctx)
	c.report, c.ov = rv.report, rv.override
	if t.OnEnd != nil || c.report != nil {
		c.began = time.Now()
	}
	if err := c.ctx.Err(); err != nil {
		return c.fail(StopCanceled, err, true)
	}
	c.setup()
	if t.Policy.PropagateDeadline && c.tooLate(c.lim.permitWait(0)) {
		return c.fail(StopDeadline, errTooLate, false)
	}
	return nil
}

// errTooLate is the cause of a request refused before its first attempt:
// its deadline leaves less time than the dependency's attempts need.
var errTooLate = fmt.Errorf("retryhttp: too little time left for an attempt: %w", context.DeadlineExceeded)

// tooLate reports whether an attempt begun after a wait of delay could not
// end before the request's deadline, by the dependency's measured latency
// (failFastQuantile). Before the first estimate, any attempt may end in
// time.
func (c *call) tooLate(delay time.Duration) bool {
	deadline, ok := c.ctx.Deadline()
	if !ok {
		return false
	}
	need := c.hs.lat.least()
	return need > 0 && !time.Now().Add(delay+need).Before(deadline)
}

// resume sets the call up for a request whose first attempt RoundTrip's
// plain path already made (Transport.plain): the base has its body, the
// first outcome is resp and err, and the call goes on from its decision.
func (c *call) resume(t *Transport, req *http.Request, resp *http.Response, err error) {
	c.t, c.req, c.out = t, req, req
	c.ctx = req.Context()
	c.setup()
	o := &c.o
	o.sent, o.number, o.resp, o.err = req, 1, resp, err
	c.strayOK = true // as send finds it before a first attempt
	o.class = c.classify(resp, err)
	c.n = 1
	c.budget().Deposit(o.class == Success)
}

// setup is start's work once the request's context is known to be alive.
func (c *call) setup() {
	t, req := c.t, c.req
	p := &t.Policy
	c.max = p.maxAttempts()
	timeout := p.Timeout
	if c.ov != nil {
		c.max, timeout = c.ov.apply(c.max, timeout)
	}
	c.lim = t.Limiter
	if t.PerHost != nil && req.URL != nil { // a nil URL is the base's error to report
		c.dest = t.PerHost.get(req.URL)
		c.lim = c.dest.limiter
	}
	c.observing = t.OnAttempt != nil || t.Logger != nil || c.report != nil
	if timeout > 0 {
		c.ctx, c.cancel = context.WithTimeout(c.ctx, timeout)
		c.out = req.WithContext(c.ctx)
	}
	c.safe = idempotentMethod(req.Method)
	if !c.safe && c.max > 1 { // a key only matters to a retry
		name := p.idempotencyHeader()
		if _, ok := headerKey(req.Header, name); ok {
			c.safe = true
		} else {
			if out := t.withNewKey(req, c.out, name); out != nil {
				c.out = out
				c.safe = true
			}
		}
	}
	c.hedged = c.max > 1 && p.hedgeable(req)
	c.measured = (c.hedged && p.hedgeQuantile() > 0) || p.attemptTimeoutQuantile() > 0 || p.PropagateDeadline
	if c.hedged || c.measured {
		if c.dest != nil {
			c.hs = c.dest.hedges.get()
		} else {
			c.hs = t.hedges.get()
		}
	}
	if c.hedged {
		c.hs.quota.deposit(p.hedgeRatio()) // each request that may be hedged adds its share
	}
}

// budget is what pays for the request's retries and hedges.
func (c *call) budget() Budget {
	if c.dest != nil {
		return c.dest.budget
	}
	return c.t.inUse
}

// attemptTimeout bounds each attempt, or is zero: the Override's, the
// measured one (Policy.AttemptTimeoutQuantile) once it is formed, or
// Policy.AttemptTimeout.
func (c *call) attemptTimeout() time.Duration {
	if c.ownTimeout() {
		return c.ov.AttemptTimeout
	}
	p := &c.t.Policy
	if p.attemptTimeoutQuantile() > 0 {
		if d := c.hs.lat.attemptTimeout(); d > 0 {
			return min(d, p.AttemptTimeout)
		}
	}
	return p.AttemptTimeout
}

// ownTimeout reports whether the request's Override sets its attempt
// timeout. Its cuts are not counted in the shared latencies.
func (c *call) ownTimeout() bool { return c.ov != nil && c.ov.AttemptTimeout > 0 }

// timeoutMeasured reports whether the attempt timeout is the measured one,
// whose cuts the latencies count as censored.
func (c *call) timeoutMeasured() bool {
	return c.t.Policy.attemptTimeoutQuantile() > 0 && !c.ownTimeout()
}

// replayable reports whether the request's body, if any, can be had again.
func (c *call) replayable() bool {
	return c.req.Body == nil || c.req.Body == http.NoBody || c.req.GetBody != nil
}

// acquire takes the next attempt's send permit from the Limiter, if there is
// one. With Policy.PropagateDeadline, a permit after which the attempt
// could not end in time is refused (errTooLate).
func (c *call) acquire() error {
	if c.lim != nil {
		var need time.Duration
		if c.t.Policy.PropagateDeadline {
			need = c.hs.lat.least()
		}
		return c.lim.acquire(c.ctx, &c.permit, need)
	}
	return nil
}

// send makes one attempt, hedged or not as the Policy says, each copy
// under AttemptTimeout if it is set, and classifies it.
func (c *call) send() {
	o := &c.o // o's response and release were handed on or discarded
	// o still holds the last attempt's outcome, zero before the first.
	o.retrying = o.class
	c.strayOK = !errors.Is(o.err, context.Canceled)
	o.number, o.sent = c.n+1, c.out
	if c.observing {
		o.start = time.Now()
	}
	o.sent = c.stamp(c.out, o.number)
	c.unsent = false // the base closes the body from here on
	c.sent = c.paid != nil
	if c.hedged {
		c.sendHedgeable()
	} else {
		c.sendMeasured()
	}
	c.n = o.number + int(o.hedges.sent) // hedges are attempts too
	if o.number == 1 {
		c.budget().Deposit(o.class == Success) // before a retry is weighed
	}
}

// sendHedgeable makes an attempt of a request that may be hedged: hedged
// when a hedge delay is known, shorter than AttemptTimeout, and MaxAttempts
// leaves room for a hedge, else alone, its latency measured all the same
// for HedgeQuantile. A hedge due as AttemptTimeout ends its first copy, or
// later, would be a retry that neither waits nor pays.
func (c *call) sendHedgeable() {
	var delay time.Duration
	if c.o.number < c.max {
		delay = c.hedgeDelay()
		if at := c.attemptTimeout(); at > 0 && delay >= at {
			delay = 0
		}
	}
	c.o.hedges = hedgeStats{} // the last attempt's, if it was hedged
	if delay > 0 {
		c.sendHedged(delay)
		return
	}
	c.sendMeasured()
}

// stamp returns the request attempt n sends: out, or a copy of it with the
// attempt's number and the time it has left, as the Policy asks. The time
// left is the sooner of the request's deadline and the attempt timeout.
func (c *call) stamp(out *http.Request, n int) *http.Request {
	p := &c.t.Policy
	if p.SendAttemptHeader {
		out = withAttemptHeader(out, n)
	}
	if p.PropagateDeadline {
		// The attempt's own deadline: its timeout cuts it, and its caller
		// gives up on it, first.
		left, ok := time.Duration(0), false
		if deadline, has := c.ctx.Deadline(); has {
			left, ok = time.Until(deadline), true
		}
		if at := c.attemptTimeout(); at > 0 && (!ok || at < left) {
			left, ok = at, true
		}
		if ok {
			out = withTimeLeft(out, left)
		}
	}
	return out
}

// sendMeasured makes an attempt that is not hedged, and measures its
// latency when the Policy keeps estimates. One cut by the measured
// timeout is counted as censored; one the caller's context ended is not
// counted.
func (c *call) sendMeasured() {
	if !c.measured {
		c.sendOne()
		return
	}
	c.o.cut = 0
	start := time.Now()
	c.sendOne()
	if c.ctx.Err() != nil || c.o.cut > 0 && c.timeoutMeasured() {
		return // the caller's end; or a measured cut, which stretch.fire counted
	}
	c.hs.lat.attempt(time.Since(start), c.o.cut, c.timeoutMeasured(), c.ownTimeout(), c.t.Policy.quantiles())
}

// sendOne makes an attempt that is not hedged.
func (c *call) sendOne() {
	o, p := &c.o, &c.t.Policy
	switch {
	case c.attemptTimeout() > 0:
		c.sendTimed()
	case c.permit.l != nil:
		used := c.take()
		o.resp, o.err = roundTripOnce(c.t.base(), o.sent)
		o.class = c.classify(o.resp, o.err)
		used.answered(p, o.resp, o.err, o.class)
	default:
		o.resp, o.err = c.t.base().RoundTrip(o.sent)
		if (o.resp == nil) == (o.err == nil) {
			o.resp, o.err = repair(o.resp, o.err) // as roundTripOnce does
		}
		if p.Classify == nil && o.err == nil {
			o.class = statusClass(o.resp.StatusCode) // DefaultClassify's, without the calls
		} else {
			o.class = c.classify(o.resp, o.err)
		}
	}
}

// take hands the next attempt's permit to the attempt that is sent under
// it.
func (c *call) take() permit {
	p := c.permit
	c.permit = permit{}
	c.o.permitWait = p.waited
	return p
}

// sendTimed makes one attempt under Policy.AttemptTimeout: the attempt has a
// context of its own and a timer that ends it. The timer runs on through the
// classification: a Classify that peeks into a body that never comes is cut
// off with the attempt. If the timer fired first, and the request's context
// is still alive, the attempt failed with ErrAttemptTimeout, whatever
// arrived.
// Once the timer is stopped, the body that is returned can be read for as
// long as the caller's context allows.
func (c *call) sendTimed() {
	o, p := &c.o, &c.t.Policy
	used := c.take()
	actx, release := context.WithCancel(o.sent.Context())
	o.release = release
	timeout := c.attemptTimeout()
	o.cut = 0
	var st *stretch
	if c.timeoutMeasured() {
		st = &stretch{lat: &c.hs.lat, qs: p.quantiles(), ctx: c.ctx, release: release, limit: timeout}
		st.mu.Lock()
		o.timer = time.AfterFunc(timeout, st.fire)
		st.timer = o.timer
		st.mu.Unlock()
		o.stretch = st
	} else {
		o.timer = time.AfterFunc(timeout, release)
	}
	o.resp, o.err = roundTripOnce(c.t.base(), o.sent.WithContext(actx))
	o.class = c.classify(o.resp, o.err)
	var fired bool
	if st != nil {
		fired, timeout = st.stop()
	} else {
		fired = !o.timer.Stop()
	}
	o.timer, o.stretch = nil, nil
	switch {
	case fired && o.sent.Context().Err() == nil:
		discard(o.resp, release)
		o.resp, o.release = nil, nil
		o.err = fmt.Errorf("%w after %v", ErrAttemptTimeout, timeout)
		o.class = p.classify(nil, o.err)
		o.cut = timeout
	case o.err != nil:
		release()
		o.release = nil
	}
	used.answered(p, o.resp, o.err, o.class)
}

// stretch is the timer of an attempt under a measured timeout. When it
// fires, a timeout measured longer since the attempt began takes over. An
// attempt in flight when the dependency slowed is then not cut by the
// shorter estimate it started under. A cut is counted as it is made, not
// when its attempt returns. A base slow to end a canceled attempt would
// otherwise delay the raise, and the old timeout would cut more.
type stretch struct {
	lat     *latency
	qs      quantiles       // ceiling is Policy.AttemptTimeout
	ctx     context.Context // the request's: a cut after it ended is not counted
	release func()          // ends the attempt

	mu      sync.Mutex
	timer   *time.Timer
	limit   time.Duration // the timeout in force
	stopped bool          // the attempt returned first
	cut     bool          // fire cut the attempt
}

// fire runs when the timer does: it stretches the attempt to a longer
// measured timeout, or cuts it.
func (s *stretch) fire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return
	}
	if now := min(s.lat.attemptTimeout(), s.qs.ceiling); now > s.limit {
		s.timer.Reset(now - s.limit)
		s.limit = now
		return
	}
	s.cut = true
	if s.ctx.Err() == nil {
		s.lat.cut(s.limit, s.qs)
	}
	s.release()
}

// stop ends the timer once the attempt returned. It reports whether fire
// cut the attempt first, and the timeout in force.
func (s *stretch) stop() (cut bool, limit time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopped = true
	s.timer.Stop()
	return s.cut, s.limit
}

// decide settles the tokens of the retry just made (refunded if it
// succeeded, spent if not), then chooses what follows the outcome: a
// retryable one is weighed for a retry, anything else is done.
func (c *call) decide() {
	if c.paid == nil && c.o.err == nil && !c.o.class.retryable() {
		c.v = verdict{} // done: a first attempt's answer
		return
	}
	c.weighOutcome()
}

// weighOutcome is decide's work when there is some: a retry's tokens to
// settle, an error, a retryable answer.
func (c *call) weighOutcome() {
	o := &c.o
	if c.paid != nil {
		if o.class == Success {
			c.refund(true) // the retry that succeeded pays nothing
		} else {
			c.paid = nil // sent and failed: spent
		}
	}
	c.sent = false
	switch {
	case o.err != nil && c.ctx.Err() != nil:
		// The caller's context ended (or Policy.Timeout passed) during
		// the attempt: whatever the error says, that is why it failed.
		c.v = verdict{decision: StopCanceled}
	case o.class.retryable():
		c.v = c.weigh()
	default:
		c.v = verdict{decision: Done}
	}
}

// classify is the Policy's class for the attempt's outcome, but for a stray
// cancellation. A stray one says "canceled" while the request's context is
// alive: the cancellation was not the caller's. net/http can fail a request
// that way when it shares a connection with another request, canceled as
// its bodyless response came. Hedging cancels losing copies in flight all
// the time. Such an attempt failed with its connection. It is Transient,
// not the Permanent of a caller's cancellation. It is not a failure before
// sending, so an unkeyed write is not retried.
//
// A cancellation that follows one is not stray (strayOK false). A base that
// fails with context.Canceled every time is then not retried again and
// again, at the budget's expense. A token source whose context ended is
// such a base. A cancellation whose cause is errCopyCanceled, a hedged
// copy's end, is stray whatever came before it. Under load it may strike
// twice.
func (c *call) classify(resp *http.Response, err error) Class {
	class := c.t.Policy.classify(resp, err)
	if class == Permanent && err != nil && c.ctx.Err() == nil && errors.Is(err, context.Canceled) &&
		(c.strayOK || errors.Is(err, errCopyCanceled)) {
		return Transient
	}
	return class
}

// weigh decides whether a retryable outcome is retried and after what wait.
// A retry is paid for (c.paid) and its request made ready (c.out) before it
// is decided.
func (c *call) weigh() verdict {
	o, p := &c.o, &c.t.Policy
	switch {
	case c.ctx.Err() != nil:
		return verdict{decision: StopCanceled}
	case o.resp != nil && noRetrySignal(o.resp.Header):
		return verdict{decision: StopDownstream}
	case c.n >= c.max:
		return verdict{decision: StopAttempts}
	case !c.replayable():
		return verdict{decision: StopNotReplayable}
	case !c.safe && !(o.err != nil && neverSent(o.err)):
		return verdict{decision: StopNotIdempotent}
	}

	var now time.Time // read the clock only for a date or a deadline
	deadline, hasDeadline := c.ctx.Deadline()
	if hasDeadline || (o.resp != nil && len(o.resp.Header[headerRetryAfter]) > 0) {
		now = time.Now()
	}
	v := verdict{decision: Retry}
	rnd := p.rand()
	if sd, ok := serverDelay(p, o.resp, now); ok {
		v.server = true
		v.delay = sd + uniform(rnd, p.serverSpread(sd))
		if sd > p.maxServerDelay() || v.delay < sd { // v.delay < sd: overflow
			return verdict{decision: StopServerDelay, delay: sd, server: true}
		}
	} else {
		v.delay = p.Jitter.delay(c.n-1, p.baseDelay(o.class), p.maxDelay(), c.prevDelay, rnd)
	}
	if hasDeadline && !now.Add(v.delay).Before(deadline) {
		v.decision = StopDeadline
		return v
	}
	if p.PropagateDeadline && c.tooLate(v.delay+c.lim.permitWait(v.delay)) {
		v.decision, v.late = StopDeadline, true
		return v
	}
	paid, ok := c.budget().Withdraw(c.ctx, o.class)
	switch {
	case c.ctx.Err() != nil: // the context ended while the budget decided
		if ok && paid != nil {
			paid(false)
		}
		return verdict{decision: StopCanceled}
	case !ok:
		v.decision = StopBudget // a refusal pays nothing, whatever it returned
		return v
	}
	c.paid = paid
	if lim := c.lim; lim != nil && !lim.admits(c.ctx, v.delay) {
		c.refund(false)
		v.decision = StopRateLimited
		return v
	}
	next := nextRequest(c.req, c.out)
	if next == nil {
		c.refund(false)
		return verdict{decision: StopNotReplayable}
	}
	if next != c.out {
		c.out, c.unsent = next, true // a fresh body, not sent yet
	}
	return v
}

// observe passes the attempt to the hook, the Logger and the Report.
func (c *call) observe() {
	if c.observing {
		c.record()
	}
}

func (c *call) record() {
	o := &c.o
	b := c.budget()
	var u *url.URL
	if o.err != nil {
		u = urlCopy(o.sent.URL) // the error's text is redacted with it, whatever the caller does next
	}
	c.t.observe(c.ctx, c.report, b, Attempt{
		Request: o.sent, url: u, Number: o.number, Err: o.err, Class: o.class, Retrying: o.retrying,
		Decision: c.v.decision, Delay: c.v.delay, ServerDelay: c.v.server,
		tokens: b.Available(), Duration: time.Since(o.start),
		Hedges: int(o.hedges.sent), HedgeWon: o.hedges.won, HedgesRefused: int(o.hedges.refused),
		PermitWait: o.permitWait, rateLimit: c.lim.rate(),
	}, o.resp)
}

// finish ends the call after its last attempt: the response goes to the
// caller with its attempt and Timeout tied to its body, or the error is
// returned as an *Error.
func (c *call) finish() (*http.Response, error) {
	d := c.v.decision
	if d != Done {
		markLayer(c.ctx, d, c.max)
	}
	resp := c.o.resp
	if resp == nil {
		cause := c.o.err
		switch ctxErr := c.ctx.Err(); {
		case c.v.late:
			cause = fmt.Errorf("%w; last attempt: %w", errTooLate, cause)
		case d == StopCanceled && ctxErr != nil && !errors.Is(cause, ctxErr):
			// The attempt ended by its own cancel (its timeout cut it) and
			// returned after the caller's context ended: the caller's
			// reason is the call's.
			cause = fmt.Errorf("%w; last attempt: %w", ctxErr, cause)
		}
		return nil, c.fail(d, cause, false)
	}
	if c.t.OnEnd != nil || c.report != nil { // before the response is handed on: a panicking hook leaves it to cleanup
		c.end(Report{Attempts: c.n, Decision: d, Duration: time.Since(c.began)})
	}
	release, cancel := c.o.release, c.cancel
	c.done = true // with the response goes everything the call held
	if release != nil || cancel != nil {
		if resp.StatusCode == http.StatusSwitchingProtocols {
			// The upgraded connection is the caller's, outside the
			// attempt's and the Timeout's reach (net/http stops watching
			// the context once it hands the connection over).
			releaseAll(release, cancel)
		} else {
			resp.Body = onClose(resp.Body, release, cancel)
		}
	}
	return resp, nil
}

// wait discards the response that is retried and waits for the retry's turn.
// The drain counts as part of the wait.
func (c *call) wait() error {
	o := &c.o
	delay := c.v.delay
	var began time.Time
	if delay > 0 {
		began = time.Now()
	}
	discard(o.resp, o.release)
	o.resp, o.release = nil, nil
	d := delay
	if delay > 0 {
		d -= time.Since(began)
	}
	if err := sleep(c.ctx, d); err != nil {
		return err
	}
	c.prevDelay = delay
	return nil
}

// stopBefore ends a call whose next attempt will not be made, and returns its
// error: the context ended during a wait, or the Limiter had no send permit
// (why). A retry's tokens go back with cleanup.
func (c *call) stopBefore(why error) error {
	d := StopCanceled
	if errors.Is(why, errTooLate) {
		d = StopDeadline
	}
	if errors.Is(why, ErrRateLimited) {
		d = StopRateLimited
		markLayer(c.ctx, d, c.max)
		if l := c.t.Logger; l != nil && l.Enabled(c.ctx, slog.LevelWarn) {
			// No attempt was made, so no hook ran: one line says why.
			l.LogAttrs(c.ctx, slog.LevelWarn, "retryhttp: no send permit", slog.String("method", method(c.req)),
				slog.String("url", redactURL(c.req.URL)), slog.Int("attempt", c.n+1), slog.Float64("rate_limit", c.lim.rate()))
		}
	}
	cause := why
	if c.o.err != nil {
		cause = fmt.Errorf("%w; last attempt: %w", why, c.o.err)
	}
	return c.fail(d, cause, d != StopDeadline || c.n > 0) // a first attempt refused as start refuses it
}

// fail ends the call with an *Error: the attempts made, decision d, the
// cause, and a copy of the request's URL, whose secrets stay out of the
// error's text whatever the caller does with its request next. OnEnd sees
// it first.
func (c *call) fail(d Decision, cause error, abandoned bool) *Error {
	e := &Error{Report: Report{Attempts: c.n, Decision: d, Abandoned: abandoned, Err: cause}, url: urlCopy(c.req.URL)}
	if c.t.OnEnd != nil || c.report != nil {
		e.Duration = time.Since(c.began)
		c.end(e.Report)
	}
	return e
}

// end passes the request's end to the OnEnd hook and the attached Report.
func (c *call) end(r Report) {
	c.report.end(r)
	if c.t.OnEnd != nil {
		c.t.OnEnd(c.req, r)
	}
}

// cleanup releases whatever the call still holds. It runs on every way out
// of RoundTrip. After a normal return it finds little or nothing. After a
// panicking hook it closes the bodies and ends the attempt, the hedged
// copies and the Timeout. It gives back the tokens and the permit of a
// retry that will not be made. The panic then goes on to the caller.
func (c *call) cleanup() {
	if !c.done {
		c.release()
	}
}

// release is cleanup's work, when there is any.
func (c *call) release() {
	if c.race != nil {
		c.race.abandon()
	}
	if o := &c.o; o.timer != nil || o.resp != nil || o.release != nil {
		if o.stretch != nil {
			o.stretch.stop() // a fire under way neither stretches nor counts a cut
			o.stretch = nil
		} else if o.timer != nil {
			o.timer.Stop()
		}
		o.timer = nil
		if o.resp != nil {
			closeBody(o.resp.Body)
		}
		if o.release != nil {
			o.release()
		}
	}
	if c.unsent {
		closeBody(c.out.Body)
	}
	switch {
	case c.paid != nil && c.sent:
		c.paid = nil // sent, and not known to have succeeded: it was load
	case c.paid != nil:
		c.refund(false)
	}
	if c.permit.l != nil {
		c.permit.cancel()
	}
	if c.cancel != nil {
		c.cancel()
	}
}

// errNoResponse stands in for the error of a base that returned neither a
// response nor an error, so that RoundTrip never does the same.
var errNoResponse = errors.New("retryhttp: base RoundTripper returned neither a response nor an error")

// roundTripOnce makes one attempt through base and repairs the two ways a
// base can break the RoundTripper contract: a response together with an
// error (the response is closed and the error stands), and neither. It
// returns a response with a nil error, or an error with no response.
func roundTripOnce(base http.RoundTripper, req *http.Request) (*http.Response, error) {
	resp, err := base.RoundTrip(req)
	if (resp == nil) == (err == nil) {
		return repair(resp, err)
	}
	return resp, err
}

// repair is roundTripOnce's answer to a base that returned both or neither.
func repair(resp *http.Response, err error) (*http.Response, error) {
	if err == nil {
		return nil, errNoResponse
	}
	closeBody(resp.Body)
	return nil, err
}

// sleep waits for d or until ctx ends, and returns ctx's error in that case.
// A zero wait starts no timer.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// rate is Stats().Rate for a limiter that may be nil.
func (l *RateLimiter) rate() (r float64) {
	if l != nil {
		r = l.Stats().Rate
	}
	return r
}
