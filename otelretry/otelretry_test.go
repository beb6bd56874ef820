package otelretry

import (
	"context"
	"errors"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp"
	rht "github.com/herdproof/retryhttp/retryhttptest"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// sum returns the value of the counter's data point with exactly the given
// attributes, or the total over all points when none are given.
func sum(t *testing.T, m metricdata.Metrics, kv ...attribute.KeyValue) int64 {
	t.Helper()
	s, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		t.Fatalf("%s: got %T; want an int64 sum", m.Name, m.Data)
	}
	want := attribute.NewSet(kv...)
	var total int64
	for _, dp := range s.DataPoints {
		if len(kv) == 0 || dp.Attributes.Equals(&want) {
			total += dp.Value
		}
	}
	return total
}

// newMetrics makes Metrics on a meter provider read by hand, closed when
// the test ends.
func newMetrics(t *testing.T) (*Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	m, err := New(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m, reader
}

func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)

		// Request 1: 503, 429 (Retry-After: 1), 200. Request 2: 503 three
		// times. Request 3: 404.
		base := rht.NewTransport(rht.Status(503), rht.RetryAfter(429, "1"), rht.Status(200),
			rht.Status(503).Times(3), rht.Status(404))
		seen := 0
		tr := &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }},
			OnAttempt: func(retryhttp.Attempt) { seen++ }}
		m.Instrument(tr, attribute.String("client", "orders"))
		for _, method := range []string{"POST", "GET", "GET"} {
			req, _ := http.NewRequest(method, "http://orders.test/x?secret=1", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		if seen != 7 {
			t.Errorf("the Transport's own hook saw %d attempts; want 7 (it must still be called)", seen)
		}

		got := collect(t, reader)
		str := attribute.String
		for _, c := range []struct {
			name string
			kv   []attribute.KeyValue
			want int64
		}{
			{"retryhttp.attempts", nil, 7},
			{"retryhttp.attempts", []attribute.KeyValue{str("http.request.method", "GET"), str("retryhttp.class", "transient"), str("retryhttp.decision", "retry")}, 2},
			{"retryhttp.attempts", []attribute.KeyValue{str("http.request.method", "GET"), str("retryhttp.class", "transient"), str("retryhttp.decision", "attempts exhausted")}, 1},
			{"retryhttp.attempts", []attribute.KeyValue{str("http.request.method", "POST"), str("retryhttp.class", "throttling"), str("retryhttp.decision", "retry")}, 1},
			{"retryhttp.attempts", []attribute.KeyValue{str("http.request.method", "GET"), str("retryhttp.class", "permanent"), str("retryhttp.decision", "done")}, 1},
			{"retryhttp.requests", nil, 3},
			{"retryhttp.retries", nil, 4},
			{"retryhttp.retries", []attribute.KeyValue{str("http.request.method", "POST"), str("retryhttp.class", "transient")}, 1},
			{"retryhttp.retries", []attribute.KeyValue{str("http.request.method", "POST"), str("retryhttp.class", "throttling")}, 1},
			{"retryhttp.retries", []attribute.KeyValue{str("http.request.method", "GET"), str("retryhttp.class", "transient")}, 2},
			{"retryhttp.giveups", []attribute.KeyValue{str("http.request.method", "GET"), str("retryhttp.reason", "attempts exhausted")}, 1},
		} {
			if v := sum(t, got[c.name], c.kv...); v != c.want {
				t.Errorf("%s %v: got %d; want %d", c.name, c.kv, v, c.want)
			}
		}

		hist := got["retryhttp.wait"].Data.(metricdata.Histogram[float64])
		var waits uint64
		var serverSum float64
		for _, dp := range hist.DataPoints {
			waits += dp.Count
			if v, _ := dp.Attributes.Value("retryhttp.delay_source"); v.AsString() == "server" {
				serverSum += dp.Sum
			}
		}
		if waits != 4 || serverSum != 1 {
			t.Errorf("wait: got %d waits, %vs from the server; want 4 and 1s", waits, serverSum)
		}

		gauge := got["retryhttp.budget.tokens"].Data.(metricdata.Gauge[int64])
		// 500 - 14 - 5 + 5 (refund) - 14 - 14 = 458
		if len(gauge.DataPoints) != 1 || gauge.DataPoints[0].Value != 458 {
			t.Errorf("budget.tokens: got %+v; want one point of 458", gauge.DataPoints)
		}
		if v, _ := gauge.DataPoints[0].Attributes.Value("client"); v.AsString() != "orders" {
			t.Errorf("budget.tokens: got attributes %v; want client=orders", gauge.DataPoints[0].Attributes)
		}
	})
}

func TestRateLimitMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)
		// A 429 cuts the limiter to 2.5/s (a quarter of one send in the
		// meters' shortest span, 10/s); the next request waits 400 ms for
		// its permit; the one after it, with a 50 ms deadline, may wait a
		// tenth of it and gets none.
		lim := &retryhttp.RateLimiter{}
		tr := &retryhttp.Transport{Base: rht.NewTransport(rht.Status(429), rht.Status(200).Times(2)), Limiter: lim,
			Policy: retryhttp.Policy{MaxAttempts: 1}}
		m.Instrument(tr, attribute.String("client", "orders"))
		for i, timeout := range []time.Duration{0, 0, 50 * time.Millisecond} {
			ctx := context.Background()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders.test/", nil)
			resp, err := tr.RoundTrip(req)
			if i < 2 && err != nil || i == 2 && !errors.Is(err, retryhttp.ErrRateLimited) {
				t.Fatalf("request %d: got %v", i+1, err)
			}
			if resp != nil {
				resp.Body.Close()
			}
		}
		got := collect(t, reader)
		rate := got["retryhttp.ratelimit.rate"].Data.(metricdata.Gauge[float64]).DataPoints
		want := lim.Stats().Rate
		if len(rate) != 1 || rate[0].Value != want || want < 2.5 || want > 10 {
			t.Errorf("ratelimit.rate: got %+v; want one point of %v (grown from 2.5/s, within twice the demand)", rate, want)
		}
		for name, want := range map[string]int64{"retryhttp.ratelimit.cuts": 1, "retryhttp.ratelimit.refused": 1} {
			if v := sum(t, got[name]); v != want {
				t.Errorf("%s: got %d; want %d", name, v, want)
			}
		}
		hist := got["retryhttp.ratelimit.wait"].Data.(metricdata.Histogram[float64]).DataPoints
		if len(hist) != 1 || hist[0].Count != 1 || hist[0].Sum != 0.4 {
			t.Errorf("ratelimit.wait: got %+v; want one wait of 400 ms", hist)
		}
	})
}

// storeBudget is a shared budget as otelretry sees one (redisbudget's): it
// reports its calls to its store and its local refusals. Here every
// withdrawal is a call, and a refusal after an empty answer makes the next
// withdrawal refuse locally, without one.
type storeBudget struct {
	retryhttp.Budget
	calls, local int64
	empty        bool
}

func (b *storeBudget) Withdraw(ctx context.Context, c retryhttp.Class) (func(bool), bool) {
	if b.empty {
		b.local++
		return nil, false
	}
	b.calls++
	refund, ok := b.Budget.Withdraw(ctx, c)
	b.empty = !ok
	return refund, ok
}

func (b *storeBudget) StoreCalls() (calls, localRefusals int64) { return b.calls, b.local }

func TestSharedBudgetMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)
		// Request 1: a retry paid (call 1), then one refused (call 2).
		// Request 2: its retry refused without a call.
		b := &storeBudget{Budget: retryhttp.NewTokenBucket(retryhttp.RetryCost)}
		tr := &retryhttp.Transport{Base: rht.NewTransport(rht.Status(503).Times(4)), Budget: b}
		m.Instrument(tr, attribute.String("client", "orders"))
		for range 2 {
			req, _ := http.NewRequest("GET", "http://orders.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		got := collect(t, reader)
		for name, want := range map[string]int64{"retryhttp.budget.calls": 2, "retryhttp.budget.local_refusals": 1} {
			if v := sum(t, got[name], attribute.String("client", "orders")); v != want {
				t.Errorf("%s: got %d; want %d", name, v, want)
			}
		}
		// A budget that keeps no store reports neither.
		plain := &retryhttp.Transport{Base: rht.NewTransport(rht.Status(200))}
		m.Instrument(plain, attribute.String("client", "billing"))
		got = collect(t, reader)
		if n := len(got["retryhttp.budget.calls"].Data.(metricdata.Sum[int64]).DataPoints); n != 1 {
			t.Errorf("budget.calls: got %d points; want 1, the shared budget's", n)
		}
	})
}

// TestGuideNames checks docs/guide-metrics.md against what the module
// emits: every instrument in its table with exactly the attribute keys the
// table lists, and the values its alert matches.
func TestGuideNames(t *testing.T) {
	guide, err := os.ReadFile("../docs/guide-metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)
		base := rht.NewTransport(rht.Status(503), rht.Status(200), rht.Status(503))
		tr := &retryhttp.Transport{Base: base, Budget: retryhttp.NewTokenBucket(retryhttp.RetryCost)}
		m.Instrument(tr, attribute.String("client", "orders"))
		for range 2 { // the second request finds the budget empty
			req, _ := http.NewRequest("GET", "http://orders.test/", nil)
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		// A hedged request, so that the hedges counter is emitted too.
		hedged := &retryhttp.Transport{Base: rht.NewTransport(rht.Status(200).WithDelay(time.Second), rht.Status(200)),
			Policy: retryhttp.Policy{HedgeDelay: time.Millisecond, HedgeRatio: 1}}
		m.Instrument(hedged, attribute.String("client", "orders"))
		req, _ := http.NewRequest("GET", "http://orders.test/", nil)
		resp, err := hedged.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// A shared budget that reports its store calls, so that the
		// budget.calls and budget.local_refusals instruments are emitted.
		shared := &retryhttp.Transport{Base: rht.NewTransport(rht.Status(503), rht.Status(200)),
			Budget: &storeBudget{Budget: retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens)}}
		m.Instrument(shared, attribute.String("client", "orders"))
		req, _ = http.NewRequest("GET", "http://orders.test/", nil)
		resp, err = shared.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		// A throttled Transport with a Limiter: a 429, then a request that
		// waits for its permit, so that the ratelimit instruments are too.
		limited := &retryhttp.Transport{Base: rht.NewTransport(rht.Status(429), rht.Status(200)),
			Limiter: &retryhttp.RateLimiter{}, Policy: retryhttp.Policy{MaxAttempts: 1}}
		m.Instrument(limited, attribute.String("client", "orders"))
		for range 2 {
			req, _ := http.NewRequest("GET", "http://orders.test/", nil)
			resp, err := limited.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		}
		got := collect(t, reader)

		row := regexp.MustCompile("(?m)^\\| `(retryhttp\\.[a-z_.]+)` \\| [^|]+ \\| ([^|]+) \\|")
		rows := row.FindAllSubmatch(guide, -1)
		if len(rows) != 14 {
			t.Fatalf("got %d instrument rows in the guide; want 14", len(rows))
		}
		for _, r := range rows {
			name := string(r[1])
			want := regexp.MustCompile("`([a-z_.]+)`").FindAllStringSubmatch(string(r[2]), -1)
			var wantKeys []string
			for _, w := range want {
				wantKeys = append(wantKeys, w[1])
			}
			if strings.HasPrefix(name, "retryhttp.budget.") || name != "retryhttp.ratelimit.wait" && strings.HasPrefix(name, "retryhttp.ratelimit.") {
				wantKeys = []string{"client"} // the attributes given to Instrument
			}
			md, ok := got[name]
			if !ok {
				t.Errorf("%s: in the guide, not emitted", name)
				continue
			}
			for _, keys := range attributeKeys(md) {
				if !slices.Equal(keys, slices.Sorted(slices.Values(wantKeys))) {
					t.Errorf("%s: emitted with attributes %v; the guide says %v", name, keys, wantKeys)
				}
			}
		}
		if len(got) != len(rows) {
			t.Errorf("got %d instruments emitted; the guide lists %d", len(got), len(rows))
		}
		alert := regexp.MustCompile(`retryhttp_reason="([^"]+)"`).FindSubmatch(guide)
		if alert == nil || string(alert[1]) != retryhttp.StopBudget.String() {
			t.Errorf("the guide's alert matches reason %q; want %q", alert, retryhttp.StopBudget.String())
		}
		if v := sum(t, got["retryhttp.giveups"], attribute.String("http.request.method", "GET"), attribute.String("retryhttp.reason", string(alert[1]))); v != 1 {
			t.Errorf("giveups with the alert's reason: got %d; want 1", v)
		}
	})
}

// attributeKeys returns the sorted attribute keys of each data point.
func attributeKeys(md metricdata.Metrics) [][]string {
	var sets []attribute.Set
	switch d := md.Data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	case metricdata.Gauge[int64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			sets = append(sets, dp.Attributes)
		}
	}
	var out [][]string
	for _, s := range sets {
		var keys []string
		for _, kv := range s.ToSlice() {
			keys = append(keys, string(kv.Key))
		}
		out = append(out, slices.Sorted(slices.Values(keys)))
	}
	return out
}

func TestPerHostStateNotObserved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, reader := newMetrics(t)
		tr := &retryhttp.Transport{Base: rht.NewTransport(rht.Status(503), rht.Status(200)), PerHost: &retryhttp.PerHost{
			Limiter: func(string) *retryhttp.RateLimiter { return &retryhttp.RateLimiter{} },
		}}
		m.Instrument(tr, attribute.String("client", "webhooks"))
		req, _ := http.NewRequest("GET", "http://hooks.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		got := collect(t, reader)
		for _, name := range []string{"retryhttp.budget.tokens", "retryhttp.ratelimit.rate"} {
			if g, ok := got[name]; ok && g.Data != nil {
				t.Errorf("%s: got %+v; want no data (per-destination state is not observed)", name, g.Data)
			}
		}
		if v := sum(t, got["retryhttp.attempts"]); v != 2 {
			t.Errorf("retryhttp.attempts: got %d; want 2", v)
		}
	})
}

// A retry decided, then never made because the request's context ended in
// its wait, is not counted in retries (retries over requests is the share
// of traffic that retries add); its wait is in wait (helper-24's case).
func TestRetryEndedInItsWaitIsAGiveup(t *testing.T) {
	// A retry decided and then ended in its wait is no retry, and a giveup
	// with the wait's reason: the caller's context ended, or the Limiter
	// had no permit in time (another client's two 429s, the second a fall
	// of the capacity, paused it for 5 s, past the request's 3 s deadline).
	tests := []struct {
		name    string
		limited bool
		reason  string
	}{
		{"canceled", false, "canceled"},
		{"no permit", true, "rate limited"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				m, reader := newMetrics(t)
				base := rht.NewTransport(rht.RetryAfter(503, "1"), rht.Status(200))
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				var lim *retryhttp.RateLimiter
				if tt.limited {
					lim = &retryhttp.RateLimiter{}
				}
				tr := &retryhttp.Transport{Base: base, Limiter: lim,
					OnAttempt: func(a retryhttp.Attempt) {
						if a.Decision != retryhttp.Retry {
							return
						}
						if !tt.limited {
							cancel() // the caller gives up during the wait
							return
						}
						other := &retryhttp.Transport{Base: rht.NewTransport(rht.RetryAfter(429, "5")), Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
						for range 2 {
							req, _ := http.NewRequest("GET", "http://orders.test/", nil)
							resp, err := other.RoundTrip(req)
							if err != nil {
								t.Fatal(err)
							}
							resp.Body.Close()
						}
					}}
				m.Instrument(tr)
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders.test/", nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
					t.Fatal("got a response; want the wait's end")
				}
				if n := len(base.Attempts()); n != 1 {
					t.Fatalf("the server got %d attempts; want 1", n)
				}
				got := collect(t, reader)
				if r := got["retryhttp.retries"]; r.Data != nil { // no data point is 0
					if v := sum(t, r); v != 0 {
						t.Errorf("retries: got %d; want 0 (no retry was sent)", v)
					}
				}
				if h := got["retryhttp.wait"].Data.(metricdata.Histogram[float64]); len(h.DataPoints) != 1 || h.DataPoints[0].Count != 1 {
					t.Errorf("wait: got %+v; want one wait", h.DataPoints)
				}
				if v := sum(t, got["retryhttp.giveups"], attribute.String("http.request.method", "GET"), attribute.String("retryhttp.reason", tt.reason)); v != 1 {
					t.Errorf("giveups, %s: got %d; want 1", tt.reason, v)
				}
				if v := sum(t, got["retryhttp.giveups"]); v != 1 {
					t.Errorf("giveups: got %d; want 1", v)
				}
			})
		})
	}
}
