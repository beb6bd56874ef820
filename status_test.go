package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// provokeServerClosedIdle returns the keep-alive race's error: the server
// closes an idle HTTP/1.1 connection just as the client takes it for a PUT.
// The race is made certain by ending the connection's read with EOF from
// httptrace's GotConn, after the connection was taken and before the request
// is written, and waiting for net/http to close it.
func provokeServerClosedIdle(t *testing.T) error {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	defer srv.Close()
	conns := make(chan *steerConn, 2)
	base := &http.Transport{DialContext: dialSteered(conns)}
	defer base.CloseIdleConnections()

	resp, err := base.RoundTrip(mustReq(t, "GET", srv.URL))
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close() // the connection is idle now
	conn := <-conns

	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		if info.Reused {
			conn.EOF()
			<-conn.closed // net/http saw the EOF and closed the connection
		}
	}}
	req := mustReq(t, "PUT", srv.URL)
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	resp, err = base.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
		t.Fatal("got a response; want net/http's error for a server that closed an idle connection")
	}
	return err
}

// holding returns a handler that closes entered when its (only) request
// arrives, then holds it until release is closed or the client goes away.
func holding(entered, release chan struct{}) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
}

// provokeLostPing returns the error of an HTTP/2 connection closed because
// its health-check ping went unanswered: the connection goes silent while a
// request waits for its response.
func provokeLostPing(t *testing.T) error {
	entered := make(chan struct{})
	release := make(chan struct{})
	defer close(release)
	conns := make(chan *steerConn, 1)
	base := &http.Transport{
		DialContext: dialSteered(conns),
		HTTP2:       &http.HTTP2Config{SendPingTimeout: 20 * time.Millisecond, PingTimeout: 20 * time.Millisecond},
	}
	srv := startH2C(t, holding(entered, release), base)
	go func() {
		<-entered
		(<-conns).Freeze() // the network goes silent: no frame, no ping answer
	}()
	resp, err := base.RoundTrip(mustReq(t, "PUT", srv.URL))
	if err == nil {
		resp.Body.Close()
		t.Fatal("got a response; want net/http's error for a lost connection")
	}
	return err
}

// provokeGoAway returns the error of an HTTP/2 request whose server sent
// GOAWAY during a graceful shutdown and then closed the connection with the
// request still open.
func provokeGoAway(t *testing.T) error {
	entered := make(chan struct{})
	release := make(chan struct{})
	conns := make(chan *steerConn, 1)
	base := &http.Transport{DialContext: dialSteered(conns)}
	srv := startH2C(t, holding(entered, release), base)
	shutdown := make(chan struct{})
	go func() {
		c := <-conns
		c.mu.Lock()
		c.eofAfterGoAway = true // read the GOAWAY, then find the connection closed
		c.mu.Unlock()
		<-entered
		srv.Config.Shutdown(context.Background()) // sends GOAWAY, waits for the handler
		close(shutdown)
	}()
	resp, err := base.RoundTrip(mustReq(t, "PUT", srv.URL))
	close(release)
	<-shutdown
	if err == nil {
		resp.Body.Close()
		t.Fatal("got a response; want net/http's GOAWAY error")
	}
	return err
}

// provokeClosedConn returns the error of a read on a connection closed
// under it.
func provokeClosedConn(t *testing.T) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	_, err = c.Read(make([]byte, 1))
	return err
}

func TestNetHTTPConnectionFailures(t *testing.T) {
	tests := []struct {
		name    string
		provoke func(*testing.T) error
		text    string // what the error says today, checked so that a change shows
	}{
		{"server closed idle connection", provokeServerClosedIdle, "http: server closed idle connection"},
		{"HTTP2 connection lost to a ping", provokeLostPing, "http2: client connection lost"},
		{"HTTP2 GOAWAY then close", provokeGoAway, "http2: server sent GOAWAY and closed the connection"},
		{"use of closed network connection", provokeClosedConn, "use of closed network connection"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.provoke(t)
			if !strings.Contains(err.Error(), tc.text) {
				t.Errorf("got %q; want it to contain %q (net/http changed: update status.go)", err, tc.text)
			}
			if !connClosedUnder(err) {
				t.Error("connClosedUnder: got false; want true")
			}
			if got := DefaultClassify(nil, err); got != Transient {
				t.Errorf("DefaultClassify: got %v; want Transient", got)
			}
			if neverSent(err) {
				t.Error("neverSent: got true; want false (the server may have processed the request)")
			}
			// As the http.Client sees it, too.
			if got := DefaultClassify(nil, fmt.Errorf("Put %q: %w", "http://x.test/", err)); got != Transient {
				t.Errorf("DefaultClassify, wrapped: got %v; want Transient", got)
			}
			t.Run("retried where a replay is safe", func(t *testing.T) { assertRetriedWhereSafe(t, err) })
		})
	}
}

// assertRetriedWhereSafe checks what the Transport does after err, which does
// not prove that the request went unprocessed: idempotent requests and keyed
// writes are retried, a keyless write is not.
func assertRetriedWhereSafe(t *testing.T, err error) {
	tests := []struct {
		name     string
		method   string
		policy   Policy
		attempts int
		decision Decision
	}{
		{"PUT", "PUT", Policy{}, 2, Done},
		{"DELETE", "DELETE", Policy{}, 2, Done},
		{"POST keyed through IdempotencyHeader", "POST", Policy{IdempotencyHeader: "Amz-Sdk-Invocation-Id", NewIdempotencyKey: noKey}, 2, Done},
		{"POST without a key", "POST", Policy{NewIdempotencyKey: noKey}, 1, StopNotIdempotent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(rht.Step{Err: err}, rht.Status(200))
				var rep Report
				req := newReq(t, tc.method, "body")
				if tc.policy.IdempotencyHeader != "" {
					req.Header.Set(tc.policy.IdempotencyHeader, "invocation-1")
				}
				req = req.WithContext(WithReport(req.Context(), &rep))
				roundTrip(t, &Transport{Base: base, Policy: tc.policy}, req)
				rht.AssertAttempts(t, base, tc.attempts)
				if rep.Decision != tc.decision {
					t.Errorf("got decision %v; want %v", rep.Decision, tc.decision)
				}
			})
		})
	}
}

// timeoutOnly is an error with a Timeout method and nothing else, as the AWS
// SDK's ResponseTimeoutError: not a net.Error.
type timeoutOnly struct{}

func (timeoutOnly) Error() string { return "response timeout" }

func (timeoutOnly) Timeout() bool { return true }

func TestTimeoutErrorsAnywhereInTheChain(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want Class
	}{
		{"Timeout method only", timeoutOnly{}, Transient},
		{"wrapped Timeout method only", fmt.Errorf("operation error: %w", timeoutOnly{}), Transient},
		// A read *net.OpError whose Err wraps the timeout: OpError.Timeout
		// looks only at its direct Err and says false.
		{"inside a read OpError", &net.OpError{Op: "read", Net: "tcp", Err: fmt.Errorf("tls: %w", timeoutOnly{})}, Transient},
		{"inside a read OpError, deadline", &net.OpError{Op: "read", Net: "tcp", Err: fmt.Errorf("x: %w", context.DeadlineExceeded)}, Transient},
		{"joined", errors.Join(errors.New("first"), timeoutOnly{}), Transient},
		{"Timeout false", &net.OpError{Op: "read", Net: "tcp", Err: errors.New("bad record")}, Permanent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := DefaultClassify(nil, tc.err); got != tc.want {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
}

func TestClassifyRealErrors(t *testing.T) {
	plain := &http.Transport{ResponseHeaderTimeout: 50 * time.Millisecond}
	t.Cleanup(plain.CloseIdleConnections)
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	tlsSrv.Config.ErrorLog = log.New(io.Discard, "", 0) // the handshake failure is the point
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	hang := make(chan struct{})
	hangSrv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-hang }))
	t.Cleanup(func() { close(hang); hangSrv.Close() })
	eofSrv := rht.NewServer(t, rht.CommitThenDrop())
	resetSrv := rht.NewServer(t, rht.Reset())
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()

	tests := []struct {
		name string
		req  func() *http.Request
		want Class
	}{
		{"connection refused", func() *http.Request { return mustReq(t, "GET", closedURL(t)) }, Transient},
		{"EOF before the response", func() *http.Request { return mustReq(t, "GET", eofSrv.URL) }, Transient},
		{"reset before the response", func() *http.Request { return mustReq(t, "GET", resetSrv.URL) }, Transient},
		{"response header timeout", func() *http.Request { return mustReq(t, "GET", hangSrv.URL) }, Transient},
		{"unknown certificate authority", func() *http.Request { return mustReq(t, "GET", tlsSrv.URL) }, Permanent},
		{"TLS to a plain HTTP server", func() *http.Request {
			return mustReq(t, "GET", strings.Replace(eofSrv.URL, "http:", "https:", 1))
		}, Permanent},
		{"unsupported scheme", func() *http.Request { return mustReq(t, "GET", "ftp://127.0.0.1/") }, Permanent},
		{"invalid header", func() *http.Request {
			r := mustReq(t, "GET", eofSrv.URL)
			r.Header.Set("Bad Header", "x")
			return r
		}, Permanent},
		{"caller cancelled", func() *http.Request { return mustReq(t, "GET", hangSrv.URL).WithContext(cancelled) }, Permanent},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := plain.RoundTrip(tc.req())
			if err == nil {
				resp.Body.Close()
				t.Fatalf("got status %d; want an error", resp.StatusCode)
			}
			if got := DefaultClassify(nil, err); got != tc.want {
				t.Errorf("got %v for %q; want %v", got, err, tc.want)
			}
		})
	}
	t.Run("DNS", func(t *testing.T) {
		for _, c := range []struct {
			err  *net.DNSError
			want Class
		}{
			{&net.DNSError{Err: "no such host", Name: "x.invalid", IsNotFound: true}, Permanent},
			{&net.DNSError{Err: "server misbehaving", Name: "x.test", IsTemporary: true}, Transient},
		} {
			if got := DefaultClassify(nil, &net.OpError{Op: "dial", Err: c.err}); got != c.want {
				t.Errorf("got %v for %v; want %v", got, c.err, c.want)
			}
		}
	})
}

// An attempt that fails with context.Canceled while the request's own
// context (and the attempt's) is alive was not canceled by the caller:
// net/http hands such an error to an unrelated request when another
// request on the same connection is canceled at the moment its bodyless
// response is delivered (the connection is already back in the pool; see
// persistConn.roundTrip's <-ctxDoneChan case). Hedging cancels losing
// copies in flight all the time. The request must be retried, not
// returned as "not retryable: context canceled". One whose cause is a
// hedged copy's end (this package's own) is stray however often it comes:
// under load it may strike an attempt and its retry.
func TestStrayCancelIsRetried(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cause  error // of the stray cancellations
		strays int32 // attempts that get one, from the first
		hedged bool
	}{
		{"hedged=false", context.Canceled, 1, false},
		{"hedged=true", context.Canceled, 1, true},
		{"a hedged copy's end, twice", errCopyCanceled, 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Int32
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if calls.Add(1) <= tc.strays {
					return nil, fmt.Errorf("read: %w", tc.cause) // another request's cancel
				}
				return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
			})
			p := Policy{BaseDelay: time.Millisecond}
			if tc.hedged {
				p.HedgeDelay, p.HedgeRatio = time.Hour, 1
			}
			tr := &Transport{Base: base, Policy: p}
			req, _ := http.NewRequest("GET", "http://example.test/", nil)
			want := tc.strays + 1
			resp, err := tr.RoundTrip(req)
			if err != nil {
				t.Fatalf("got error %v after %d attempts; want 200 after %d (the request's context is alive)", err, calls.Load(), want)
			}
			resp.Body.Close()
			if calls.Load() != want {
				t.Errorf("got %d attempts; want %d", calls.Load(), want)
			}
		})
	}
}

// A base that fails with context.Canceled for good, while the request's own
// context is alive (a token source whose context ended, say: "oauth2:
// cannot fetch token: ... context canceled"), is retried once, not to
// MaxAttempts on every request at the shared budget's expense: a handful of
// requests would drain it for everyone.
func TestCanceledForGoodIsRetriedOnce(t *testing.T) {
	var calls atomic.Int32
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return nil, &url.Error{Op: "Post", URL: "https://oauth.example/token",
			Err: fmt.Errorf("oauth2: cannot fetch token: %w", context.Canceled)}
	})
	b := newTokenBucket(DefaultBudgetTokens)
	tr := &Transport{Base: base, Budget: b, Policy: Policy{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond}}
	const requests = 20
	for range requests {
		req, _ := http.NewRequest("GET", "http://example.test/", nil)
		if _, err := tr.RoundTrip(req); err == nil {
			t.Fatal("got no error")
		}
	}
	// A stray cancellation is retried; one that comes back on the retry is
	// not stray: at most one retry per request.
	if got := int(calls.Load()); got > 2*requests {
		t.Errorf("got %d attempts for %d requests; want at most %d: a cancellation that comes back every time is not a stray one", got, requests, 2*requests)
	}
	if got, want := b.Available(), DefaultBudgetTokens-requests*RetryCost; got < want {
		t.Errorf("got %d tokens left; want at least %d: the budget paid for retries of a base that cancels for good", got, want)
	}
}

// Held: the stray-cancel retry leaves an unkeyed write alone, an
// AttemptTimeout still reads as one, an Override's NoRetries holds, and a
// caller's cancel is never retried.
func TestStrayCancelLimits(t *testing.T) {
	strayThenOK := func(calls *atomic.Int32) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if calls.Add(1) == 1 {
				return nil, fmt.Errorf("read: %w", context.Canceled)
			}
			return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
		})
	}
	t.Run("unkeyed POST", func(t *testing.T) {
		var calls atomic.Int32
		tr := &Transport{Base: strayThenOK(&calls), Policy: Policy{BaseDelay: time.Millisecond, NewIdempotencyKey: noKey}}
		req, _ := http.NewRequest("POST", "http://example.test/", strings.NewReader("x"))
		_, err := tr.RoundTrip(req)
		var e *Error
		if !errors.As(err, &e) || calls.Load() != 1 || e.Decision != StopNotIdempotent {
			t.Errorf("got %v after %d attempts; want StopNotIdempotent after 1", err, calls.Load())
		}
	})
	t.Run("override NoRetries", func(t *testing.T) {
		var calls atomic.Int32
		tr := &Transport{Base: strayThenOK(&calls), Policy: Policy{BaseDelay: time.Millisecond}}
		req, _ := http.NewRequestWithContext(WithOverride(context.Background(), Override{MaxAttempts: 1}), "GET", "http://example.test/", nil)
		if _, err := tr.RoundTrip(req); err == nil || calls.Load() != 1 {
			t.Errorf("got %v after %d attempts; want an error after 1", err, calls.Load())
		}
	})
	t.Run("caller cancels", func(t *testing.T) {
		var calls atomic.Int32
		ctx, cancel := context.WithCancel(context.Background())
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			calls.Add(1)
			cancel()
			return nil, r.Context().Err()
		})
		tr := &Transport{Base: base, Policy: Policy{BaseDelay: time.Millisecond, AttemptTimeout: time.Second}}
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
		_, err := tr.RoundTrip(req)
		var e *Error
		if !errors.As(err, &e) || calls.Load() != 1 || e.Decision != StopCanceled {
			t.Errorf("got %v after %d attempts; want StopCanceled after 1", err, calls.Load())
		}
	})
	t.Run("attempt timeout", func(t *testing.T) {
		tr := &Transport{Base: rht.NewTransport(rht.Hang(), rht.Status(200)),
			Policy: Policy{BaseDelay: time.Millisecond, AttemptTimeout: 20 * time.Millisecond}}
		var rep Report
		req, _ := http.NewRequestWithContext(WithReport(context.Background(), &rep), "GET", "http://example.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if len(rep.History) != 2 || !errors.Is(rep.History[0].Err, ErrAttemptTimeout) {
			t.Errorf("got %v; want an ErrAttemptTimeout then a 200", rep.History)
		}
	})
}
