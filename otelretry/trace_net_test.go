package otelretry_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/otelretry"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// flaky is a server traced by otelhttp that answers 503 to its first
// request and 200 to the others.
func flaky(t *testing.T, tp trace.TracerProvider) *httptest.Server {
	var n atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok")
	})
	srv := httptest.NewServer(otelhttp.NewHandler(h, "server", otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{})))
	t.Cleanup(srv.Close)
	return srv
}

// shape keeps what a tree's shape is checked by across layers: the
// retry's attributes, resend counts and statuses.
func shape(k attribute.Key) bool {
	switch k {
	case "retryhttp.decision", "retryhttp.attempts", "http.request.resend_count", "http.response.status_code":
		return true
	}
	return false
}

// get sends a GET for url through rt and reads the body.
func get(t *testing.T, rt http.RoundTripper, url string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("got status %d; want 200", resp.StatusCode)
	}
}

// TestTraceWithOtelhttp: otelhttp.NewTransport above the Transport gives
// the request's span, with a span per attempt under it; below, otelhttp's
// own client span is under each attempt's. Either way the server's span
// joins the span that sent the request it got, through the traceparent
// header.
func TestTraceWithOtelhttp(t *testing.T) {
	prop := propagation.TraceContext{}
	tests := []struct {
		name  string
		build func(tp trace.TracerProvider) http.RoundTripper
		want  string
	}{
		{name: "none", build: func(tp trace.TracerProvider) http.RoundTripper {
			tr := &retryhttp.Transport{Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }}}
			return otelretry.Trace(tr, tp, prop)
		}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  event retryhttp.wait
  GET client error http.response.status_code=503 retryhttp.decision=retry
    GET server error http.response.status_code=503
  GET client http.request.resend_count=1 http.response.status_code=200 retryhttp.decision=done
    GET server http.response.status_code=200
`},
		{name: "otelhttp above", build: func(tp trace.TracerProvider) http.RoundTripper {
			tr := &retryhttp.Transport{Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }}}
			traced := otelretry.Trace(tr, tp, prop)
			return otelhttp.NewTransport(traced, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(prop))
		}, want: `
HTTP GET client http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  event retryhttp.wait
  GET client error http.response.status_code=503 retryhttp.decision=retry
    GET server error http.response.status_code=503
  GET client http.request.resend_count=1 http.response.status_code=200 retryhttp.decision=done
    GET server http.response.status_code=200
`},
		{name: "otelhttp below", build: func(tp trace.TracerProvider) http.RoundTripper {
			tr := &retryhttp.Transport{
				Base:   otelhttp.NewTransport(&http.Transport{}, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(prop)),
				Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }},
			}
			return otelretry.Trace(tr, tp, prop)
		}, want: `
retryhttp GET internal http.response.status_code=200 retryhttp.attempts=2 retryhttp.decision=done
  event retryhttp.wait
  GET client error http.response.status_code=503 retryhttp.decision=retry
    HTTP GET client error http.response.status_code=503
      GET server error http.response.status_code=503
  GET client http.request.resend_count=1 http.response.status_code=200 retryhttp.decision=done
    HTTP GET client http.response.status_code=200
      GET server http.response.status_code=200
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tp, exp := newTracer(t)
			srv := flaky(t, tp)
			get(t, tt.build(tp), srv.URL+"/items?token=secret")
			spans := exp.GetSpans()
			if got := tree(spans, shape); got != tt.want[1:] {
				t.Errorf("got span tree\n%s\nwant\n%s", got, tt.want[1:])
			}
			ids := map[trace.TraceID]bool{}
			for _, s := range spans {
				ids[s.SpanContext.TraceID()] = true
			}
			if len(ids) != 1 {
				t.Errorf("got %d traces; want 1", len(ids))
			}
		})
	}
}

// TestTraceRedactsAsTheLogger: url.full is the URL the Transport's Logger
// prints.
func TestTraceRedactsAsTheLogger(t *testing.T) {
	urls := []string{
		"http://user:pass@orders.test/items?token=secret#frag",
		"https://KEY:@orders.test:8443/a%2Fb/c?x=1",
		"http://[::1]:8080/?q#access_token=abc",
		"http://orders.test",
	}
	for _, u := range urls {
		t.Run(u, func(t *testing.T) {
			tp, exp := newTracer(t)
			var log bytes.Buffer
			tr := &retryhttp.Transport{
				Base:   &script{codes: []int{503, 200}},
				Policy: retryhttp.Policy{Rand: func(int64) int64 { return 0 }},
				Logger: slog.New(slog.NewJSONHandler(&log, nil)),
			}
			rt := otelretry.Trace(tr, tp, nil)
			req, _ := http.NewRequest("GET", u, nil)
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			var line struct{ URL string }
			if err := json.NewDecoder(&log).Decode(&line); err != nil || line.URL == "" {
				t.Fatalf("got log %q (%v); want a line with a url", log.String(), err)
			}
			for _, s := range exp.GetSpans() {
				for _, kv := range s.Attributes {
					if kv.Key == "url.full" && kv.Value.AsString() != line.URL {
						t.Errorf("span %s: got url.full %q; want %q, as logged", s.Name, kv.Value.AsString(), line.URL)
					}
				}
			}
		})
	}
}

// script answers with its codes in turn, the last one repeated, from one
// response value each: it allocates nothing.
type script struct {
	codes []int
	resps []http.Response
	n     atomic.Int32
}

func (s *script) RoundTrip(req *http.Request) (*http.Response, error) {
	if s.resps == nil {
		for _, c := range s.codes {
			s.resps = append(s.resps, http.Response{StatusCode: c, Body: http.NoBody, Header: http.Header{}})
		}
	}
	i := min(int(s.n.Add(1))-1, len(s.resps)-1)
	return &s.resps[i], nil
}

// TestTraceFreeWhenOff: without a provider that records and without a
// span in the request's context, a traced success costs no allocation.
func TestTraceFreeWhenOff(t *testing.T) {
	if _, s := otel.Tracer("").Start(context.Background(), "probe"); s.SpanContext().IsValid() {
		t.Fatal("a global TracerProvider is set in this test binary; this test needs none")
	}
	allocs := func(rt http.RoundTripper, ctx context.Context) float64 {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders.test/items", nil)
		return testing.AllocsPerRun(1000, func() {
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
		})
	}
	plain := allocs(&retryhttp.Transport{Base: &script{codes: []int{200}}}, context.Background())
	sdk, _ := newTracer(t)
	tests := []struct {
		name string
		tp   trace.TracerProvider
	}{
		{name: "no provider set"},
		{name: "the global provider, not set", tp: otel.GetTracerProvider()},
		{name: "a noop provider", tp: noop.NewTracerProvider()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := otelretry.Trace(&retryhttp.Transport{Base: &script{codes: []int{200}}}, tt.tp, nil)
			if got := allocs(rt, context.Background()); got != plain || got != 0 {
				t.Errorf("got %v allocations a traced success; want %v, as untraced", got, plain)
			}
		})
	}
	on := allocs(otelretry.Trace(&retryhttp.Transport{Base: &script{codes: []int{200}}}, sdk, nil),
		context.Background())
	t.Logf("allocations of a success: %v untraced and traced off; %v traced by the SDK", plain, on)
	if on == 0 {
		t.Errorf("got 0 allocations traced by the SDK; want some (the measure measures nothing)")
	}
}

// TestTraceOnOnceTheGlobalProviderIsSet: Trace with otel's global provider,
// not set yet, traces nothing, and traces once it is set. It runs in a
// process of its own, so that the global provider set stays out of the
// other tests.
func TestTraceOnOnceTheGlobalProviderIsSet(t *testing.T) {
	if os.Getenv("OTELRETRY_SET_GLOBAL") == "" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestTraceOnOnceTheGlobalProviderIsSet$", "-test.v")
		cmd.Env = append(os.Environ(), "OTELRETRY_SET_GLOBAL=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !bytes.Contains(out, []byte("--- PASS")) {
			t.Fatalf("in a process of its own: %v\n%s", err, out)
		}
		return
	}
	rt := otelretry.Trace(&retryhttp.Transport{Base: &script{codes: []int{200}}}, nil, nil)
	tp, exp := newTracer(t)
	send := func() {
		req, _ := http.NewRequest("GET", "http://orders.test/items", nil)
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	send()
	if got := len(exp.GetSpans()); got != 0 {
		t.Errorf("before the global provider is set: got %d spans; want 0", got)
	}
	otel.SetTracerProvider(tp)
	send()
	if got := tree(exp.GetSpans(), shape); got != "retryhttp GET internal http.response.status_code=200 retryhttp.attempts=1 retryhttp.decision=done\n  GET client http.response.status_code=200 retryhttp.decision=done\n" {
		t.Errorf("once it is set: got span tree\n%s", got)
	}
}

// BenchmarkTrace: a GET success through a Transport, untraced, with an
// OnAttempt hook that does nothing (what Trace adds to the Transport),
// traced with no provider set (off), and traced by the SDK.
func BenchmarkTrace(b *testing.B) {
	sdk := sdktrace.NewTracerProvider() // no exporter: spans are recorded and dropped
	defer sdk.Shutdown(context.Background())
	for _, bc := range []struct {
		name string
		rt   func(*retryhttp.Transport) http.RoundTripper
	}{
		{"untraced", func(tr *retryhttp.Transport) http.RoundTripper { return tr }},
		{"hook", func(tr *retryhttp.Transport) http.RoundTripper { tr.OnAttempt = func(retryhttp.Attempt) {}; return tr }},
		{"off", func(tr *retryhttp.Transport) http.RoundTripper { return otelretry.Trace(tr, nil, nil) }},
		{"sdk", func(tr *retryhttp.Transport) http.RoundTripper { return otelretry.Trace(tr, sdk, nil) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			rt := bc.rt(&retryhttp.Transport{Base: &script{codes: []int{200}}})
			req, _ := http.NewRequest("GET", "http://orders.test/items", nil)
			b.ReportAllocs()
			for b.Loop() {
				resp, err := rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
		})
	}
}
