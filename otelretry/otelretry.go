// Package otelretry turns a retryhttp.Transport's per-attempt hook into
// OpenTelemetry metrics, and Trace makes it trace each attempt as a span.
// It is a module of its own so that OpenTelemetry stays out of the
// library's dependencies.
//
//	m, err := otelretry.New(otel.GetMeterProvider())
//	...
//	tr := &retryhttp.Transport{}
//	m.Instrument(tr) // before the Transport's first use
//
// Instruments (all prefixed retryhttp.):
//
//   - attempts (counter): every attempt, by class (success, permanent,
//     transient, throttling), decision and method.
//   - requests (counter): every RoundTrip that made at least one attempt, by
//     method; retries (counter): every retry sent, by method and the class
//     of the failure it retries. Their ratio is the retry share of traffic,
//     the figure to alert on (the SRE book's suggested limit is 10%).
//   - wait (histogram, seconds): every wait before a retry, by source
//     (backoff or server), as decided.
//   - giveups (counter): every RoundTrip that ended on a retryable failure
//     without retrying it, by reason (attempts exhausted, retry budget
//     exhausted, deadline too close, ...), those whose retry was decided
//     and then ended in its wait included (canceled, or rate limited: the
//     Limiter had no permit). A retry that ends in its wait is not in
//     retries; its wait is in wait.
//   - hedges (counter): hedged copies (Policy.HedgeDelay), by method and
//     outcome (sent, won, refused: the hedge share or the Limiter had none).
//   - budget.tokens (observable gauge): the tokens in each instrumented
//     Transport's budget; budget.fallback (observable gauge): 1 while a
//     fleet budget (redisbudget) pays from its local fallback, else 0.
//   - budget.calls and budget.local_refusals (observable counters): a
//     shared budget's calls to its store and the retries it refused without
//     one, for budgets that report them (redisbudget's: a method
//     StoreCalls() (calls, localRefusals int64)).
//   - ratelimit.rate (observable gauge, permits per second), ratelimit.cuts
//     and ratelimit.refused (observable counters): the state of each
//     instrumented Transport's Limiter, if it has one; ratelimit.wait
//     (histogram, seconds): every wait for a send permit.
//
// Methods are recorded as sent; URLs, headers and bodies never.
//
// Trace gives each attempt a client span in OpenTelemetry's HTTP
// conventions, under the request's span, with the decision and the class
// as attributes and an event for each wait:
//
//	client := &http.Client{Transport: otelretry.Trace(tr, otel.GetTracerProvider(), otel.GetTextMapPropagator())}
//
// docs/guide-tracing.md describes the spans, and where otelhttp goes.
package otelretry

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"sync"

	"github.com/herdproof/retryhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the meter.
const ScopeName = "github.com/herdproof/retryhttp/otelretry"

// Metrics records a Transport's attempts. Make one with New; it is safe for
// concurrent use and may instrument several Transports.
type Metrics struct {
	attempts metric.Int64Counter
	requests metric.Int64Counter
	retries  metric.Int64Counter
	giveups  metric.Int64Counter
	wait     metric.Float64Histogram
	tokens   metric.Int64ObservableGauge
	fallback metric.Int64ObservableGauge
	calls    metric.Int64ObservableCounter
	local    metric.Int64ObservableCounter
	hedges   metric.Int64Counter
	rate     metric.Float64ObservableGauge
	cuts     metric.Int64ObservableCounter
	refused  metric.Int64ObservableCounter
	permit   metric.Float64Histogram
	meter    metric.Meter

	mu       sync.Mutex
	budgets  map[retryhttp.Budget]attribute.Set
	limiters map[*retryhttp.RateLimiter]attribute.Set
	reg      metric.Registration
}

// New creates the instruments on a meter from mp.
func New(mp metric.MeterProvider) (*Metrics, error) {
	m := &Metrics{meter: mp.Meter(ScopeName), budgets: map[retryhttp.Budget]attribute.Set{},
		limiters: map[*retryhttp.RateLimiter]attribute.Set{}}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	m.attempts, err = m.meter.Int64Counter("retryhttp.attempts", metric.WithDescription("HTTP attempts made, by outcome class and decision"), metric.WithUnit("{attempt}"))
	add(err)
	m.requests, err = m.meter.Int64Counter("retryhttp.requests", metric.WithDescription("Requests (RoundTrips) that made at least one attempt"), metric.WithUnit("{request}"))
	add(err)
	m.retries, err = m.meter.Int64Counter("retryhttp.retries", metric.WithDescription("Retries made"), metric.WithUnit("{retry}"))
	add(err)
	m.giveups, err = m.meter.Int64Counter("retryhttp.giveups", metric.WithDescription("Requests that ended on a retryable failure without retrying it, by reason"), metric.WithUnit("{request}"))
	add(err)
	m.wait, err = m.meter.Float64Histogram("retryhttp.wait", metric.WithDescription("Waits before retries"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30))
	add(err)
	m.tokens, err = m.meter.Int64ObservableGauge("retryhttp.budget.tokens", metric.WithDescription("Tokens in the retry budget"), metric.WithUnit("{token}"))
	add(err)
	m.hedges, err = m.meter.Int64Counter("retryhttp.hedges", metric.WithDescription("Hedged copies: sent, won (their answer was used), refused (the hedge share or the Limiter had none)"), metric.WithUnit("{hedge}"))
	add(err)
	m.fallback, err = m.meter.Int64ObservableGauge("retryhttp.budget.fallback",
		metric.WithDescription("1 while a shared budget (redisbudget) pays from its local fallback because its store cannot be reached, else 0"),
		metric.WithUnit("1"))
	add(err)
	m.calls, err = m.meter.Int64ObservableCounter("retryhttp.budget.calls",
		metric.WithDescription("Calls a shared budget (redisbudget) made to its store"), metric.WithUnit("{call}"))
	add(err)
	m.local, err = m.meter.Int64ObservableCounter("retryhttp.budget.local_refusals",
		metric.WithDescription("Retries a shared budget refused without calling its store, having seen it empty a moment before"),
		metric.WithUnit("{retry}"))
	add(err)
	m.rate, err = m.meter.Float64ObservableGauge("retryhttp.ratelimit.rate",
		metric.WithDescription("Send permits per second the Transport's RateLimiter allows; 0 while it is not limiting"), metric.WithUnit("{permit}/s"))
	add(err)
	m.cuts, err = m.meter.Int64ObservableCounter("retryhttp.ratelimit.cuts",
		metric.WithDescription("Cuts of the send rate after throttling responses"), metric.WithUnit("{cut}"))
	add(err)
	m.refused, err = m.meter.Int64ObservableCounter("retryhttp.ratelimit.refused",
		metric.WithDescription("Attempts not made because no send permit could come before their deadline"), metric.WithUnit("{attempt}"))
	add(err)
	m.permit, err = m.meter.Float64Histogram("retryhttp.ratelimit.wait", metric.WithDescription("Waits for send permits"), metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	add(err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m.reg, err = m.meter.RegisterCallback(m.observe, m.tokens, m.fallback, m.calls, m.local, m.rate, m.cuts, m.refused)
	if err != nil {
		return nil, err
	}
	return m, nil
}

// storeCaller is a shared budget that reports its own load on its store
// (redisbudget.Budget), without otelretry importing it.
type storeCaller interface {
	StoreCalls() (calls, localRefusals int64)
}

func (m *Metrics) observe(_ context.Context, o metric.Observer) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for b, attrs := range m.budgets {
		o.ObserveInt64(m.tokens, int64(b.Available()), metric.WithAttributeSet(attrs))
		var down int64
		if f, ok := b.(interface{ Fallback() (bool, error) }); ok {
			if fb, _ := f.Fallback(); fb {
				down = 1
			}
		}
		o.ObserveInt64(m.fallback, down, metric.WithAttributeSet(attrs))
		if sb, ok := b.(storeCaller); ok {
			calls, refused := sb.StoreCalls()
			o.ObserveInt64(m.calls, calls, metric.WithAttributeSet(attrs))
			o.ObserveInt64(m.local, refused, metric.WithAttributeSet(attrs))
		}
	}
	for l, attrs := range m.limiters {
		st := l.Stats()
		o.ObserveFloat64(m.rate, st.Rate, metric.WithAttributeSet(attrs))
		o.ObserveInt64(m.cuts, int64(st.Cuts), metric.WithAttributeSet(attrs))
		o.ObserveInt64(m.refused, st.Refused, metric.WithAttributeSet(attrs))
	}
	return nil
}

// Instrument makes t report to m: its OnAttempt records every attempt, and
// its OnEnd the requests that end in a wait for a retry (each then calls
// the hook t had, if any); its budget and its Limiter, if it
// has one, are observed by the budget.* and ratelimit.* instruments under
// the given attributes (a "client" name, say). With PerHost set, there is a
// budget and a Limiter per destination, and they are not observed: a gauge
// per destination would be one time series per host called. A nil Budget
// is given the bucket the Transport would make, so that it is observed.
// Call it before t's first use.
func (m *Metrics) Instrument(t *retryhttp.Transport, attrs ...attribute.KeyValue) {
	m.mu.Lock()
	if t.PerHost == nil {
		if t.Budget == nil {
			t.Budget = retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens)
		}
		m.budgets[t.Budget] = attribute.NewSet(attrs...)
		if t.Limiter != nil {
			m.limiters[t.Limiter] = attribute.NewSet(attrs...)
		}
	}
	m.mu.Unlock()
	next, nextEnd := t.OnAttempt, t.OnEnd
	t.OnAttempt = func(a retryhttp.Attempt) {
		m.record(a)
		if next != nil {
			next(a)
		}
	}
	t.OnEnd = func(req *http.Request, r retryhttp.Report) {
		m.recordEnd(req, r)
		if nextEnd != nil {
			nextEnd(req, r)
		}
	}
}

// recordEnd records a request's end: a giveup if the request ended in the
// wait for a retry, which no attempt's record shows. The other giveups are
// counted by record, at the attempt that decided them.
func (m *Metrics) recordEnd(req *http.Request, r retryhttp.Report) {
	if !r.Abandoned || r.Attempts == 0 {
		return
	}
	ctx, methodAttr := of(req)
	m.giveups.Add(ctx, 1, metric.WithAttributes(methodAttr, attribute.String("retryhttp.reason", r.Decision.String())))
}

// record records one attempt.
func (m *Metrics) record(a retryhttp.Attempt) {
	ctx, methodAttr := of(a.Request)
	classAttr := attribute.String("retryhttp.class", a.Class.String())
	m.attempts.Add(ctx, 1, metric.WithAttributes(methodAttr, classAttr, attribute.String("retryhttp.decision", a.Decision.String())))
	if a.Number == 1 {
		m.requests.Add(ctx, 1, metric.WithAttributes(methodAttr))
	}
	if a.Hedges > 0 {
		m.hedges.Add(ctx, int64(a.Hedges), metric.WithAttributes(methodAttr, attribute.String("retryhttp.hedge", "sent")))
	}
	if a.HedgeWon {
		m.hedges.Add(ctx, 1, metric.WithAttributes(methodAttr, attribute.String("retryhttp.hedge", "won")))
	}
	if a.HedgesRefused > 0 {
		m.hedges.Add(ctx, int64(a.HedgesRefused), metric.WithAttributes(methodAttr, attribute.String("retryhttp.hedge", "refused")))
	}
	if a.PermitWait > 0 {
		m.permit.Record(ctx, a.PermitWait.Seconds(), metric.WithAttributes(methodAttr))
	}
	if a.Retrying != retryhttp.Success {
		// A retry is counted when it is made, by the class it retries: a
		// Retry decision may still end in its wait.
		m.retries.Add(ctx, 1, metric.WithAttributes(methodAttr, attribute.String("retryhttp.class", a.Retrying.String())))
	}
	switch a.Decision {
	case retryhttp.Retry:
		m.wait.Record(ctx, a.Delay.Seconds(), metric.WithAttributes(attribute.String("retryhttp.delay_source", delaySource(a))))
	case retryhttp.Done:
	default:
		m.giveups.Add(ctx, 1, metric.WithAttributes(methodAttr, attribute.String("retryhttp.reason", a.Decision.String())))
	}
}

// of returns the context to record under and the method attribute of the
// request a hook was given, which may be nil.
func of(r *http.Request) (context.Context, attribute.KeyValue) {
	if r == nil {
		return context.Background(), attribute.String("http.request.method", "GET")
	}
	return r.Context(), attribute.String("http.request.method", cmp.Or(r.Method, "GET"))
}

// Close stops observing the instrumented budgets.
func (m *Metrics) Close() error { return m.reg.Unregister() }

// delaySource names where a wait came from: "server" or "backoff".
func delaySource(a retryhttp.Attempt) string {
	if a.ServerDelay {
		return "server"
	}
	return "backoff"
}
