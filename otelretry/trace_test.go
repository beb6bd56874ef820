package otelretry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/otelretry"
	rht "github.com/herdproof/retryhttp/retryhttptest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// destination is what every span of a request to testURL says of it:
// the URL without its user info, query or fragment.
var destination = map[attribute.Key]string{
	"http.request.method": "GET",
	"url.full":            "http://orders.test/items",
	"server.address":      "orders.test",
	"server.port":         "80",
}

const testURL = "http://user:pass@orders.test/items?token=secret#frag"

// newTracer is a tracer provider that exports to memory as spans end.
func newTracer(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, exp
}

// spanTree renders the spans as a tree, children under their parent in the
// order they started (then by resend count), one line per span: its name,
// its kind, "error" if its status is, its attributes but those left out,
// sorted; an event is a line under its span, starting with "event".
func spanTree(spans tracetest.SpanStubs, leave map[attribute.Key]string) string {
	return tree(spans, func(k attribute.Key) bool { _, ok := leave[k]; return !ok })
}

// tree renders the spans as spanTree does, with the attributes keep keeps.
func tree(spans tracetest.SpanStubs, keep func(attribute.Key) bool) string {
	ids := map[trace.SpanID]bool{}
	for _, s := range spans {
		ids[s.SpanContext.SpanID()] = true
	}
	children := map[trace.SpanID][]tracetest.SpanStub{}
	var roots []tracetest.SpanStub
	for _, s := range spans {
		if p := s.Parent.SpanID(); s.Parent.IsValid() && ids[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	order := func(ss []tracetest.SpanStub) {
		slices.SortStableFunc(ss, func(a, b tracetest.SpanStub) int {
			if c := a.StartTime.Compare(b.StartTime); c != 0 {
				return c
			}
			return int(resendCount(a) - resendCount(b))
		})
	}
	var b strings.Builder
	var write func(s tracetest.SpanStub, depth int)
	write = func(s tracetest.SpanStub, depth int) {
		indent := strings.Repeat("  ", depth)
		fmt.Fprintf(&b, "%s%s %s", indent, s.Name, s.SpanKind)
		if s.Status.Code == codes.Error {
			b.WriteString(" error")
		}
		b.WriteString(attrs(s.Attributes, keep) + "\n")
		for _, e := range s.Events {
			fmt.Fprintf(&b, "%s  event %s%s\n", indent, e.Name, attrs(e.Attributes, keep))
		}
		kids := children[s.SpanContext.SpanID()]
		order(kids)
		for _, c := range kids {
			write(c, depth+1)
		}
	}
	order(roots)
	for _, r := range roots {
		write(r, 0)
	}
	return b.String()
}

func resendCount(s tracetest.SpanStub) int64 {
	for _, kv := range s.Attributes {
		if kv.Key == "http.request.resend_count" {
			return kv.Value.AsInt64()
		}
	}
	return 0
}

func attrs(kvs []attribute.KeyValue, keep func(attribute.Key) bool) string {
	var parts []string
	for _, kv := range kvs {
		if keep(kv.Key) {
			parts = append(parts, string(kv.Key)+"="+kv.Value.Emit())
		}
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

// checkDestination reports every span whose destination attributes are not
// want's.
func checkDestination(t *testing.T, spans tracetest.SpanStubs, want map[attribute.Key]string) {
	t.Helper()
	for _, s := range spans {
		got := map[attribute.Key]string{}
		for _, kv := range s.Attributes {
			if _, ok := want[kv.Key]; ok {
				got[kv.Key] = kv.Value.Emit()
			}
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("span %s: got %s=%q; want %q", s.Name, k, got[k], v)
			}
		}
	}
}

// halfJitter draws the middle of every backoff window: a first wait of
// 25ms after a transient failure.
func halfJitter(n int64) int64 { return n / 2 }

func TestTraceSpanTrees(t *testing.T) {
	tests := []struct {
		name   string
		steps  []rht.Step
		policy retryhttp.Policy
		budget retryhttp.Budget
		cancel time.Duration // the request's context ends then, if not 0
		want   string
	}{
		{name: "success", steps: []rht.Step{rht.Status(200)}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=1 retryhttp.decision=done
  GET client http.response.status_code=200 retryhttp.class=success retryhttp.decision=done
`},
		{name: "a retry then a success", steps: []rht.Step{rht.Status(503), rht.Status(200)}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  event retryhttp.wait retryhttp.delay=0.025 retryhttp.delay_source=backoff
  GET client error error.type=503 http.response.status_code=503 retryhttp.class=transient retryhttp.decision=retry
  GET client http.request.resend_count=1 http.response.status_code=200 retryhttp.class=success retryhttp.decision=done
`},
		{name: "a Retry-After then a success", steps: []rht.Step{rht.RetryAfter(429, "2"), rht.Status(200)},
			want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  event retryhttp.wait retryhttp.delay=2.1 retryhttp.delay_source=server
  GET client error error.type=429 http.response.status_code=429 retryhttp.class=throttling retryhttp.decision=retry
  GET client http.request.resend_count=1 http.response.status_code=200 retryhttp.class=success retryhttp.decision=done
`},
		{name: "a stop on the budget", steps: []rht.Step{rht.Status(503)}, budget: retryhttp.NewTokenBucket(0), want: `
retryhttp GET internal error error.type=503 http.response.status_code=503 retryhttp.attempts=1 retryhttp.decision=retry budget exhausted
  GET client error error.type=503 http.response.status_code=503 retryhttp.class=transient retryhttp.decision=retry budget exhausted
`},
		{name: "attempts exhausted on resets", steps: []rht.Step{rht.Reset()}, want: `
retryhttp GET internal error error.type=*retryhttptest.connError retryhttp.attempts=3 retryhttp.decision=attempts exhausted
  event retryhttp.wait retryhttp.delay=0.025 retryhttp.delay_source=backoff
  event retryhttp.wait retryhttp.delay=0.05 retryhttp.delay_source=backoff
  GET client error error.type=*retryhttptest.connError retryhttp.class=transient retryhttp.decision=retry
  GET client error error.type=*retryhttptest.connError http.request.resend_count=1 retryhttp.class=transient retryhttp.decision=retry
  GET client error error.type=*retryhttptest.connError http.request.resend_count=2 retryhttp.class=transient retryhttp.decision=attempts exhausted
`},
		{name: "a base error that names the URL", steps: []rht.Step{{Err: fmt.Errorf("GET %s giving up: %w", testURL,
			&url.Error{Op: "Get", URL: testURL, Err: errors.New("connection refused")})}},
			policy: retryhttp.Policy{MaxAttempts: 1}, want: `
retryhttp GET internal error error.type=*errors.errorString retryhttp.attempts=1 retryhttp.decision=done
  GET client error error.type=*errors.errorString retryhttp.class=permanent retryhttp.decision=done
`},
		{name: "a hedged win", steps: []rht.Step{rht.Status(200).WithDelay(time.Second), rht.Status(200)},
			policy: retryhttp.Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  GET client error error.type=canceled retryhttp.hedge=lost
  GET client http.request.resend_count=1 http.response.status_code=200 retryhttp.class=success retryhttp.decision=done retryhttp.hedge=won
`},
		{name: "a hedged attempt that failed, then a retry", steps: []rht.Step{rht.Status(503).WithDelay(20 * time.Millisecond),
			rht.Status(503), rht.Status(200)},
			policy: retryhttp.Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=3 retryhttp.decision=done
  event retryhttp.wait retryhttp.delay=0.05 retryhttp.delay_source=backoff
  GET client error error.type=503 http.response.status_code=503 retryhttp.class=transient retryhttp.decision=retry retryhttp.hedge=won
  GET client error error.type=503 http.request.resend_count=1 http.response.status_code=503 retryhttp.hedge=lost
  GET client http.request.resend_count=2 http.response.status_code=200 retryhttp.class=success retryhttp.decision=done
`},
		{name: "a hedge that lost", steps: []rht.Step{rht.Status(200).WithDelay(20 * time.Millisecond), rht.Hang()},
			policy: retryhttp.Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  GET client http.response.status_code=200 retryhttp.class=success retryhttp.decision=done retryhttp.hedge=won
  GET client error error.type=canceled http.request.resend_count=1 retryhttp.hedge=lost
`},
		{name: "an attempt timeout then a success", steps: []rht.Step{rht.Status(200).WithDelay(time.Second), rht.Status(200)},
			policy: retryhttp.Policy{AttemptTimeout: 100 * time.Millisecond}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  event retryhttp.wait retryhttp.delay=0.025 retryhttp.delay_source=backoff
  GET client error error.type=timeout retryhttp.class=transient retryhttp.decision=retry
  GET client http.request.resend_count=1 http.response.status_code=200 retryhttp.class=success retryhttp.decision=done
`},
		{name: "a wait ended by the context", steps: []rht.Step{rht.Status(503), rht.Status(200)}, cancel: 10 * time.Millisecond, want: `
retryhttp GET internal error error.type=canceled retryhttp.attempts=1 retryhttp.decision=canceled
  event retryhttp.wait retryhttp.delay=0.025 retryhttp.delay_source=backoff
  GET client error error.type=503 http.response.status_code=503 retryhttp.class=transient retryhttp.decision=retry
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tp, exp := newTracer(t)
				base := rht.NewTransport(tt.steps...)
				tt.policy.Rand = halfJitter
				tr := &retryhttp.Transport{Base: base, Policy: tt.policy, Budget: tt.budget}
				rt := otelretry.Trace(tr, tp, nil)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tt.cancel > 0 {
					time.AfterFunc(tt.cancel, cancel)
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", testURL, nil)
				resp, err := rt.RoundTrip(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				synctest.Wait() // a hedged copy that lost ends its span
				spans := exp.GetSpans()
				if got := spanTree(spans, destination); got != tt.want[1:] {
					t.Errorf("got span tree\n%s\nwant\n%s", got, tt.want[1:])
				}
				checkDestination(t, spans, destination)
				checkNoSecret(t, spans)
			})
		})
	}
}

// checkNoSecret reports every span that shows a part of testURL that the
// Logger leaves out: in its status, an attribute or an event.
func checkNoSecret(t *testing.T, spans tracetest.SpanStubs) {
	t.Helper()
	for _, s := range spans {
		texts := []string{s.Status.Description}
		for _, kv := range s.Attributes {
			texts = append(texts, kv.Value.Emit())
		}
		for _, e := range s.Events {
			for _, kv := range e.Attributes {
				texts = append(texts, kv.Value.Emit())
			}
		}
		for _, text := range texts {
			for _, secret := range []string{"secret", "pass", "frag", "user"} {
				if strings.Contains(text, secret) {
					t.Errorf("span %s: got %q, with %q; want no secret of the URL", s.Name, text, secret)
				}
			}
		}
	}
}

// TestTraceMethods: a method the HTTP conventions do not know is _OTHER,
// with the method as sent beside it, and names its spans HTTP.
func TestTraceMethods(t *testing.T) {
	tests := []struct{ method, want string }{
		{"", "retryhttp GET internal http.request.method=GET\n  GET client http.request.method=GET\n"},
		{"PUT", "retryhttp PUT internal http.request.method=PUT\n  PUT client http.request.method=PUT\n"},
		{"PURGE", "retryhttp HTTP internal http.request.method=_OTHER http.request.method_original=PURGE\n" +
			"  HTTP client http.request.method=_OTHER http.request.method_original=PURGE\n"},
	}
	for _, tt := range tests {
		t.Run(tt.method, func(t *testing.T) {
			tp, exp := newTracer(t)
			rt := otelretry.Trace(&retryhttp.Transport{Base: rht.NewTransport(rht.Status(200))}, tp, nil)
			req, _ := http.NewRequest(tt.method, testURL, nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got := tree(exp.GetSpans(), func(k attribute.Key) bool { return strings.HasPrefix(string(k), "http.request.method") })
			if got != tt.want {
				t.Errorf("got span tree\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestTraceLimiter: a request whose first attempt the Limiter cannot give
// a permit before the deadline has a span and no attempt; one that waits
// for its permit has an event for the wait.
func TestTraceLimiter(t *testing.T) {
	tests := []struct {
		name   string
		pause  string        // A's Retry-After
		within time.Duration // B's deadline
		want   string
	}{
		{name: "refused", pause: "2", within: time.Second, want: `
retryhttp GET internal error error.type=rate_limited retryhttp.attempts=0 retryhttp.decision=rate limited
`},
		{name: "waited", pause: "1", within: time.Minute, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=1 retryhttp.decision=done
  event retryhttp.wait retryhttp.delay=1 retryhttp.delay_source=limiter
  GET client http.response.status_code=200 retryhttp.class=success retryhttp.decision=done
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tp, exp := newTracer(t)
				base := rht.NewTransport(rht.RetryAfter(429, tt.pause), rht.Status(200))
				tr := &retryhttp.Transport{Base: base, Limiter: &retryhttp.RateLimiter{},
					Policy: retryhttp.Policy{MaxAttempts: 1}}
				rt := otelretry.Trace(tr, tp, nil)
				// A's 429 pauses the Limiter.
				req, _ := http.NewRequest("GET", testURL, nil)
				if resp, err := rt.RoundTrip(req); err != nil || resp.StatusCode != 429 {
					t.Fatalf("A: got %v, %v; want a 429", resp, err)
				} else {
					resp.Body.Close()
				}
				exp.Reset()
				ctx, cancel := context.WithTimeout(context.Background(), tt.within)
				defer cancel()
				req, _ = http.NewRequestWithContext(ctx, "GET", testURL, nil)
				if resp, err := rt.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
				spans := exp.GetSpans()
				if got := spanTree(spans, destination); got != tt.want[1:] {
					t.Errorf("got span tree\n%s\nwant\n%s", got, tt.want[1:])
				}
				checkDestination(t, spans, destination)
			})
		})
	}
}

// TestTraceNeverModifiesTheCallersRequest: the trace context goes into a
// copy of the headers; the caller's request is as it was.
func TestTraceNeverModifiesTheCallersRequest(t *testing.T) {
	tp, _ := newTracer(t)
	base := rht.NewTransport(rht.Status(200))
	rt := otelretry.Trace(&retryhttp.Transport{Base: base}, tp, propagation.TraceContext{})
	req, _ := http.NewRequest("GET", testURL, nil)
	req.Header.Set("X-Caller", "1")
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := len(req.Header); got != 1 || req.Header.Get("traceparent") != "" {
		t.Errorf("got caller's headers %v; want only X-Caller", req.Header)
	}
	if got := base.Attempts()[0].Header.Get("traceparent"); got == "" {
		t.Errorf("got no traceparent on the attempt; want one")
	}
}

// TestTraceHooksChained: hooks the Transport had still run, after the
// tracing.
func TestTraceHooksChained(t *testing.T) {
	tp, _ := newTracer(t)
	var mu sync.Mutex
	var seen []string
	tr := &retryhttp.Transport{
		Base:      rht.NewTransport(rht.Status(503), rht.Status(200)),
		Policy:    retryhttp.Policy{Rand: func(int64) int64 { return 0 }},
		OnAttempt: func(a retryhttp.Attempt) { mu.Lock(); seen = append(seen, a.Decision.String()); mu.Unlock() },
		OnEnd: func(_ *http.Request, r retryhttp.Report) {
			mu.Lock()
			seen = append(seen, "end "+r.Decision.String())
			mu.Unlock()
		},
	}
	rt := otelretry.Trace(tr, tp, nil)
	req, _ := http.NewRequest("GET", testURL, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if want := []string{"retry", "done", "end done"}; !slices.Equal(seen, want) {
		t.Errorf("got hooks %q; want %q", seen, want)
	}
}

// slowBase answers after a delay drawn for each attempt, 503 for one in
// three and 200 for the others; it notices a cancellation at once.
type slowBase struct {
	mu  sync.Mutex
	rnd *rand.Rand
}

func (b *slowBase) RoundTrip(req *http.Request) (*http.Response, error) {
	b.mu.Lock()
	d := time.Duration(b.rnd.IntN(40)) * time.Millisecond
	code := 200
	if b.rnd.IntN(3) == 0 {
		code = 503
	}
	b.mu.Unlock()
	select {
	case <-time.After(d):
	case <-req.Context().Done():
		return nil, req.Context().Err()
	}
	return &http.Response{StatusCode: code, Body: http.NoBody, Header: http.Header{}, Request: req}, nil
}

// TestTraceConcurrentRequestsEndEverySpan: requests at once through one
// traced Transport, hedged and retried, end every span they start: each
// request's span has as many attempt spans as it made attempts, numbered
// once each, and no more copies marked won than attempts.
func TestTraceConcurrentRequestsEndEverySpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, exp := newTracer(t)
		tr := &retryhttp.Transport{Base: &slowBase{rnd: rand.New(rand.NewPCG(1, 2))},
			Policy: retryhttp.Policy{HedgeDelay: 15 * time.Millisecond, HedgeRatio: 1, MaxAttempts: 4}}
		rt := otelretry.Trace(tr, tp, nil)
		var wg sync.WaitGroup
		for range 200 {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", testURL, nil)
				if resp, err := rt.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		synctest.Wait()
		spans := exp.GetSpans()
		byID := map[trace.SpanID]tracetest.SpanStub{}
		children := map[trace.SpanID]int{}
		won := map[trace.SpanID]int{}
		resends := map[trace.SpanID][]int64{}
		for _, s := range spans {
			byID[s.SpanContext.SpanID()] = s
			children[s.Parent.SpanID()]++
			resends[s.Parent.SpanID()] = append(resends[s.Parent.SpanID()], resendCount(s))
			for _, kv := range s.Attributes {
				if kv.Key == "retryhttp.hedge" && kv.Value.AsString() == "won" {
					won[s.Parent.SpanID()]++
				}
			}
		}
		requests, attempts := 0, 0
		for _, s := range spans {
			if s.Parent.IsValid() {
				if _, ok := byID[s.Parent.SpanID()]; !ok {
					t.Errorf("span %s: got a parent not exported; want every span ended", s.Name)
				}
				attempts++
				continue
			}
			requests++
			var want int64
			for _, kv := range s.Attributes {
				if kv.Key == "retryhttp.attempts" {
					want = kv.Value.AsInt64()
				}
			}
			if got := children[s.SpanContext.SpanID()]; int64(got) != want {
				t.Errorf("request span: got %d attempt spans; want %d, its retryhttp.attempts", got, want)
			}
			got := resends[s.SpanContext.SpanID()]
			slices.Sort(got)
			for i, c := range got {
				if c != int64(i) {
					t.Errorf("request span: got resend counts %v; want 0 to %d, once each", got, want-1)
					break
				}
			}
			if w := won[s.SpanContext.SpanID()]; int64(w) > want {
				t.Errorf("request span: got %d copies won; want at most one per attempt", w)
			}
		}
		if requests != 200 {
			t.Errorf("got %d request spans; want 200", requests)
		}
		t.Logf("%d requests, %d attempt spans", requests, attempts)
	})
}

// neither returns no response and no error, after 20ms for its first
// request: the Transport turns that into an error of its own.
type neither struct{ n atomic.Int32 }

func (b *neither) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.n.Add(1) == 1 {
		time.Sleep(20 * time.Millisecond)
	}
	return nil, nil
}

// TestTraceHedgedWinOfABaseThatReturnedNeither: a hedge that returned
// neither a response nor an error wins with the Transport's error for
// it, and is marked won.
func TestTraceHedgedWinOfABaseThatReturnedNeither(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, exp := newTracer(t)
		tr := &retryhttp.Transport{Base: &neither{},
			Policy: retryhttp.Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, MaxAttempts: 2}}
		req, _ := http.NewRequest("GET", testURL, nil)
		if _, err := otelretry.Trace(tr, tp, nil).RoundTrip(req); err == nil {
			t.Fatal("got no error; want one")
		}
		time.Sleep(20 * time.Millisecond) // the first copy answers, late
		synctest.Wait()
		got := tree(exp.GetSpans(), func(k attribute.Key) bool {
			return strings.HasPrefix(string(k), "retryhttp.") || k == "http.request.resend_count"
		})
		want := "retryhttp GET internal error retryhttp.attempts=2 retryhttp.decision=done\n" +
			"  GET client retryhttp.hedge=lost\n" +
			"  GET client error http.request.resend_count=1 retryhttp.class=permanent retryhttp.decision=done retryhttp.hedge=won\n"
		if got != want {
			t.Errorf("got span tree\n%s\nwant\n%s", got, want)
		}
	})
}
