package retryhttp

import (
	"bufio"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// service starts a service wrapped in Handler whose handler calls below
// through tr with the inbound request's context and answers with the status
// that handle chooses from what came back.
func service(t *testing.T, tr *Transport, below string, handle func(resp *http.Response, err error) int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req, _ := http.NewRequestWithContext(r.Context(), "GET", below, nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		w.WriteHeader(handle(resp, err))
	})))
	t.Cleanup(srv.Close)
	t.Cleanup(tr.CloseIdleConnections)
	return srv
}

// passStatus answers with the status from below, 502 after an error.
func passStatus(resp *http.Response, err error) int {
	if err != nil {
		return http.StatusBadGateway
	}
	return resp.StatusCode
}

func TestHandlerSignal(t *testing.T) {
	always := func(code int) func(*http.Response, error) int { return func(*http.Response, error) int { return code } }
	tests := []struct {
		name   string
		below  []rht.Step
		tr     func() *Transport
		handle func(*http.Response, error) int
		want   string // the header's value, "" for none
	}{
		{"attempts used up, 503 passed on", []rht.Step{rht.Status(503)}, func() *Transport { return &Transport{Policy: fast} }, passStatus, "attempts"},
		{"attempts used up, 429 written", []rht.Step{rht.Status(503)}, func() *Transport { return &Transport{Policy: fast} }, always(429), "attempts"},
		{"attempts used up, 500 written", []rht.Step{rht.Status(503)}, func() *Transport { return &Transport{Policy: fast} }, always(500), "attempts"},
		{"network error after retries, 502 written", []rht.Step{rht.Reset()}, func() *Transport { return &Transport{Policy: fast} }, passStatus, "attempts"},
		{"attempts used up, but 200 written", []rht.Step{rht.Status(503)}, func() *Transport { return &Transport{Policy: fast} }, always(200), ""},
		{"attempts used up, but 404 written", []rht.Step{rht.Status(503)}, func() *Transport { return &Transport{Policy: fast} }, always(404), ""},
		{"budget empty", []rht.Step{rht.Status(503)}, func() *Transport { return &Transport{Policy: fast, Budget: newTokenBucket(0)} }, passStatus, "budget"},
		{"server delay too long", []rht.Step{rht.RetryAfter(503, "3600")}, func() *Transport { return &Transport{Policy: fast} }, passStatus, "server-delay"},
		{"downstream said so", []rht.Step{rht.Status(503).WithHeader(exhaustedHeader, "attempts")}, func() *Transport { return &Transport{Policy: fast} }, passStatus, "downstream"},
		{"throttled: no send permit before the deadline", []rht.Step{rht.Status(429)}, func() *Transport {
			return &Transport{Limiter: &RateLimiter{}, Policy: Policy{Rand: lowRand, Timeout: 50 * time.Millisecond}} // the permit: 1/7 s away
		}, passStatus, "rate-limited"},
		{"one attempt allowed: nothing retried here", []rht.Step{rht.Status(503)}, func() *Transport { return &Transport{Policy: Policy{MaxAttempts: 1}} }, passStatus, ""},
		{"calls succeeded, service sheds load itself", []rht.Step{rht.Status(200)}, func() *Transport { return &Transport{Policy: fast} }, always(503), ""},
		{"retried and recovered, then the service fails", []rht.Step{rht.Status(503), rht.Status(200)}, func() *Transport { return &Transport{Policy: fast} }, always(503), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bottom := rht.NewServer(t, tc.below...)
			srv := service(t, tc.tr(), bottom.URL, tc.handle)
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get(exhaustedHeader); got != tc.want {
				t.Errorf("got %s %q on a %d; want %q", exhaustedHeader, got, resp.StatusCode, tc.want)
			}
		})
	}
}

func TestSignalStopsRetries(t *testing.T) {
	tests := []struct {
		name     string
		step     rht.Step
		attempts int
		decision Decision
	}{
		{"ours on a 503", rht.Status(503).WithHeader(exhaustedHeader, "attempts"), 1, StopDownstream},
		{"ours on a 429", rht.Status(429).WithHeader(exhaustedHeader, "budget"), 1, StopDownstream},
		{"Finagle's non-retryable nack", rht.Status(503).WithHeader("finagle-http-nonretryable-nack", "true"), 1, StopDownstream},
		{"gRPC pushback -1", rht.Status(503).WithHeader("grpc-retry-pushback-ms", "-1"), 1, StopDownstream},
		{"gRPC pushback malformed", rht.Status(503).WithHeader("grpc-retry-pushback-ms", "soon"), 1, StopDownstream},
		{"gRPC pushback 10 ms: retried", rht.Status(503).WithHeader("grpc-retry-pushback-ms", "10"), 3, StopAttempts},
		{"Stripe-Should-Retry: false", rht.Status(503).WithHeader("Stripe-Should-Retry", "false"), 1, StopDownstream},
		{"Stripe-Should-Retry: true: retried as any 503", rht.Status(503).WithHeader("Stripe-Should-Retry", "true"), 3, StopAttempts},
		{"gRPC pushback with two values", rht.Status(503).WithHeader("grpc-retry-pushback-ms", "10").WithHeader("grpc-retry-pushback-ms", "20"), 1, StopDownstream},
		{"Finagle's retryable nack: retried", rht.Status(503).WithHeader("finagle-http-nack", "true"), 3, StopAttempts},
		{"Envoy overloaded (it shed load itself): retried", rht.Status(503).WithHeader("x-envoy-overloaded", "true"), 3, StopAttempts},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			base := rht.NewTransport(tc.step)
			tr := &Transport{Base: base, Policy: Policy{Rand: lowRand}}
			var rep Report
			req := newReq(t, "GET", "")
			req = req.WithContext(WithReport(req.Context(), &rep))
			code, _, err := roundTrip(t, tr, req)
			if err != nil || code != tc.step.Code {
				t.Fatalf("got (%d, %v); want the %d", code, err, tc.step.Code)
			}
			rht.AssertAttempts(t, base, tc.attempts)
			if rep.Decision != tc.decision {
				t.Errorf("got decision %v; want %v", rep.Decision, tc.decision)
			}
			if tc.decision == StopDownstream {
				if got := tr.budgetInUse().Available(); got != DefaultBudgetTokens {
					t.Errorf("got %d tokens; want %d (the signal costs none)", got, DefaultBudgetTokens)
				}
			}
		})
	}
}

func TestHandlerKeepsWriterInterfaces(t *testing.T) {
	srv := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/flush":
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			io.WriteString(w, "second\n")
		case "/controller":
			rc := http.NewResponseController(w)
			if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			io.WriteString(w, "controlled\n")
			rc.Flush()
		case "/hijack":
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				http.Error(w, err.Error(), 500)
				return
			}
			defer conn.Close()
			buf.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 9\r\nConnection: close\r\n\r\nhijacked\n")
			buf.Flush()
		}
	})))
	defer srv.Close()
	for _, path := range []string{"/flush", "/controller", "/hijack"} {
		t.Run(path, func(t *testing.T) {
			resp, err := http.Get(srv.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(bufio.NewReader(resp.Body))
			if resp.StatusCode != 200 || len(b) == 0 {
				t.Errorf("got %d %q; want 200 and a body", resp.StatusCode, b)
			}
		})
	}
}

// plainWriter is a ResponseWriter that cannot flush.
type plainWriter struct{ h http.Header }

func (w *plainWriter) Header() http.Header { return w.h }

func (w *plainWriter) Write(b []byte) (int, error) { return len(b), nil }

func (w *plainWriter) WriteHeader(int) {}

// failingFlusher is a ResponseWriter whose flush fails, as a connection gone
// away makes it.
type failingFlusher struct{ plainWriter }

var errFlush = errors.New("flush: broken pipe")

func (w *failingFlusher) FlushError() error { return errFlush }

func TestHandlerPassesFlushErrors(t *testing.T) {
	tests := []struct {
		name string
		w    http.ResponseWriter
		want error
	}{
		{"flushes", httptest.NewRecorder(), nil},
		{"cannot flush", &plainWriter{http.Header{}}, http.ErrNotSupported},
		{"flush fails", &failingFlusher{plainWriter{http.Header{}}}, errFlush},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got error
			Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got = http.NewResponseController(w).Flush()
			})).ServeHTTP(tc.w, httptest.NewRequest("GET", "/", nil))
			if !errors.Is(got, tc.want) {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
}

func TestReverseProxyGateway(t *testing.T) {
	// A gateway: httputil.ReverseProxy over a retrying Transport, wrapped in
	// Handler. Its clients must not retry what it already retried.
	gateway := func(t *testing.T, target string) *httptest.Server {
		u, _ := url.Parse(target)
		proxy := httputil.NewSingleHostReverseProxy(u)
		tr := &Transport{Policy: fast}
		proxy.Transport = tr
		proxy.ErrorLog = nil
		srv := httptest.NewServer(Handler(proxy))
		t.Cleanup(srv.Close)
		t.Cleanup(tr.CloseIdleConnections)
		return srv
	}
	t.Run("proxied 503 after retries", func(t *testing.T) {
		bottom := rht.NewServer(t, rht.Status(503))
		gw := gateway(t, bottom.URL)
		tr := &Transport{Policy: fast}
		defer tr.CloseIdleConnections()
		resp, err := tr.RoundTrip(mustReq(t, "GET", gw.URL))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get(exhaustedHeader) != "attempts" {
			t.Errorf("got %d with %s %q; want 503 with attempts", resp.StatusCode, exhaustedHeader, resp.Header.Get(exhaustedHeader))
		}
		if got := len(bottom.Attempts()); got != 3 {
			t.Errorf("got %d attempts at the bottom; want 3 (the client above did not retry)", got)
		}
	})
	t.Run("the proxy's own 502 after retries", func(t *testing.T) {
		gw := gateway(t, closedURL(t))
		resp, err := http.Get(gw.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 502 || resp.Header.Get(exhaustedHeader) != "attempts" {
			t.Errorf("got %d with %s %q; want 502 with attempts", resp.StatusCode, exhaustedHeader, resp.Header.Get(exhaustedHeader))
		}
	})
}

func TestAttemptHeader(t *testing.T) {
	var (
		mu      sync.Mutex
		seen    []int
		retries atomic.Int32
	)
	srv := httptest.NewServer(Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := requestAttempt(r)
		mu.Lock()
		seen = append(seen, n)
		mu.Unlock()
		if n > 1 {
			retries.Add(1)
		}
		if n < 3 {
			w.WriteHeader(503)
		}
	})))
	defer srv.Close()
	tr := &Transport{Policy: Policy{BaseDelay: time.Millisecond, SendAttemptHeader: true}}
	defer tr.CloseIdleConnections()
	req := mustReq(t, "GET", srv.URL)
	code, _, err := roundTrip(t, tr, req)
	if err != nil || code != 200 {
		t.Fatalf("got (%d, %v); want 200", code, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 || seen[0] != 1 || seen[1] != 2 || seen[2] != 3 || retries.Load() != 2 {
		t.Errorf("the server saw attempts %v; want [1 2 3]", seen)
	}
	if len(req.Header) != 0 {
		t.Errorf("the caller's header changed: %v", req.Header)
	}
	for _, tc := range []struct {
		header, value string
		want          int
	}{
		{"Retry-Attempt", "2", 2},
		{"X-Envoy-Attempt-Count", "3", 3},
		{"Amz-Sdk-Request", "attempt=2; max=3", 2},
		{"Amz-Sdk-Request", "ttl=20260101T000000Z; attempt=1; max=3", 1},
		{"Retry-Attempt", "zero", 0},
		{"X-Other", "5", 0},
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set(tc.header, tc.value)
		if got := requestAttempt(r); got != tc.want {
			t.Errorf("%s: %s: got %d; want %d", tc.header, tc.value, got, tc.want)
		}
	}
}

// nopWriter is a ResponseWriter that keeps nothing, so that a benchmark
// measures the middleware, not the recorder.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header { return w.h }

func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }

func (w *nopWriter) WriteHeader(int) {}

// BenchmarkHandler compares a bare handler with the same handler under
// Handler, for a request that makes no failing call.
func BenchmarkHandler(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		io.WriteString(w, "ok")
	})
	req := httptest.NewRequest("GET", "/", strings.NewReader(""))
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"bare", h}, {"Handler", Handler(h)}} {
		b.Run(c.name, func(b *testing.B) {
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				c.h.ServeHTTP(w, req)
			}
		})
	}
}

// BenchmarkHandlerLoopback is BenchmarkHandler over a real loopback server
// and client: what a service would see.
func BenchmarkHandlerLoopback(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	for _, c := range []struct {
		name string
		h    http.Handler
	}{{"bare", h}, {"Handler", Handler(h)}} {
		b.Run(c.name, func(b *testing.B) {
			srv := httptest.NewServer(c.h)
			defer srv.Close()
			client := srv.Client()
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Get(srv.URL)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}

// A flush that the underlying writer cannot do writes nothing: the 503 the
// handler writes after it still carries exhaustedHeader.
func TestFailedFlushKeepsTheSignal(t *testing.T) {
	w := &plainWriter{http.Header{}}
	var flushErr error
	Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		markLayer(r.Context(), StopBudget, 3) // a call below ran out of budget
		flushErr = http.NewResponseController(w).Flush()
		w.WriteHeader(503)
	})).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
	if !errors.Is(flushErr, http.ErrNotSupported) {
		t.Fatalf("got flush error %v; want http.ErrNotSupported", flushErr)
	}
	if got := w.h.Get(exhaustedHeader); got != "budget" {
		t.Errorf("got %s %q on the 503; want \"budget\" (the failed flush wrote nothing)", exhaustedHeader, got)
	}
}
