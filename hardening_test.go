package retryhttp

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// Tests for what a break-it suite and a new user found (issue 9). Each
// failed, or hung, before its fix.

func TestStalledDiscardedBodyDoesNotHoldTheRetry(t *testing.T) {
	// A 503 announces 1,000 bytes, sends 7 and stalls. The drain is cut
	// after drainTimeout and the retry goes on.
	for _, proto := range []struct {
		name   string
		http2  bool
		policy Policy
	}{
		{"HTTP/1.1", false, fast},
		{"HTTP/2", true, fast},
		{"HTTP/1.1 with Timeout", false, Policy{BaseDelay: time.Millisecond, Timeout: 3 * time.Second}},
		{"HTTP/2 with AttemptTimeout", true, Policy{BaseDelay: time.Millisecond, AttemptTimeout: 3 * time.Second}},
	} {
		t.Run(proto.name, func(t *testing.T) {
			var n atomic.Int32
			srv := rht.NewUnstartedServer(t)
			srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) > 1 {
					io.WriteString(w, "ok")
					return
				}
				w.Header().Set("Content-Length", "1000")
				w.WriteHeader(503)
				io.WriteString(w, "partial")
				w.(http.Flusher).Flush()
				<-r.Context().Done() // stalls until the client gives up on it
			})
			base := start(t, srv, proto.http2)
			tr := &Transport{Base: base, Policy: proto.policy}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req := mustReq(t, "GET", srv.URL).WithContext(ctx)
			begin := time.Now()
			code, body, err := roundTrip(t, tr, req)
			if err != nil || code != 200 || body != "ok" {
				t.Fatalf("got (%d, %q, %v); want (200, ok, nil)", code, body, err)
			}
			if took := time.Since(begin); took > 2*time.Second {
				t.Errorf("took %v; want about drainTimeout (%v)", took, drainTimeout)
			}
			if got := n.Load(); got != 2 {
				t.Errorf("got %d attempts; want 2", got)
			}
		})
	}
	t.Run("the drain counts as part of the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// A body that takes 30ms to drain before a 50ms wait: the
			// retry starts 50ms after the response, not 80ms.
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: 503, Header: http.Header{}, Body: newSlowBody(30 * time.Millisecond), Request: r}, nil
			})
			var at []time.Time
			tr := &Transport{Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				at = append(at, time.Now())
				if len(at) == 1 {
					return base(r)
				}
				return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			}), Policy: Policy{Rand: highRand, BaseDelay: 50 * time.Millisecond}}
			tr.Policy.MaxDelay = 50 * time.Millisecond
			if _, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil {
				t.Fatal(err)
			}
			if gap := at[1].Sub(at[0]); gap != 50*time.Millisecond {
				t.Errorf("got %v between attempts; want 50ms", gap)
			}
		})
	})
	t.Run("a body slower than drainTimeout is closed at drainTimeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			body := newSlowBody(time.Hour)
			tr := &Transport{Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				if body.closed.Load() {
					return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
				}
				return &http.Response{StatusCode: 503, Header: http.Header{}, Body: body, Request: r}, nil
			}), Policy: Policy{Rand: lowRand}}
			start := time.Now()
			if _, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took != drainTimeout {
				t.Errorf("took %v; want exactly drainTimeout, %v", took, drainTimeout)
			}
		})
	})
}

// slowBody blocks each read for d (or until closed), then ends.
type slowBody struct {
	d      time.Duration
	closed atomic.Bool
	done   chan struct{}
}

func newSlowBody(d time.Duration) *slowBody { return &slowBody{d: d, done: make(chan struct{})} }

func (b *slowBody) Read(p []byte) (int, error) {
	select {
	case <-time.After(b.d):
		return 0, io.EOF
	case <-b.done:
		return 0, errors.New("closed")
	}
}

func (b *slowBody) Close() error {
	if b.closed.CompareAndSwap(false, true) {
		close(b.done)
	}
	return nil
}

func TestPeekBodyOnAStalledBodyIsCutByAttemptTimeout(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(400)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	classify := func(resp *http.Response, err error) Class {
		if resp != nil && resp.StatusCode == 400 {
			if b, _ := PeekBody(resp, 64); strings.Contains(string(b), "Throttling") {
				return Throttling
			}
		}
		return DefaultClassify(resp, err)
	}
	tr := &Transport{Policy: Policy{BaseDelay: time.Millisecond, AttemptTimeout: 200 * time.Millisecond, Classify: classify}}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	code, _, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL).WithContext(ctx))
	if err != nil || code != 200 {
		t.Fatalf("got (%d, %v); want 200 after the stalled peek timed out", code, err)
	}
}

func TestProxyFailuresBeforeTheOrigin(t *testing.T) {
	// A keyless POST may be retried when nothing reached the origin.
	t.Run("proxy refuses the connection", func(t *testing.T) {
		var effects atomic.Int32
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			effects.Add(1) // a plain-HTTP proxy forwards; this one answers itself
			io.WriteString(w, "ok")
		}))
		defer proxy.Close()
		down, _ := url.Parse(closedURL(t))
		up, _ := url.Parse(proxy.URL)
		var calls atomic.Int32
		base := &http.Transport{Proxy: func(*http.Request) (*url.URL, error) {
			if calls.Add(1) == 1 {
				return down, nil
			}
			return up, nil
		}}
		defer base.CloseIdleConnections()
		tr := &Transport{Base: base, Policy: Policy{BaseDelay: time.Millisecond, NoIdempotencyKeys: true}}
		var rep Report
		req := mustReq(t, "POST", "http://origin.test/charge")
		req = req.WithContext(WithReport(req.Context(), &rep))
		code, _, err := roundTrip(t, tr, req)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200 through the proxy on the retry", code, err)
		}
		if len(rep.Attempts) != 2 || effects.Load() != 1 {
			t.Errorf("got %d attempts and %d effects; want 2 and 1", len(rep.Attempts), effects.Load())
		}
		if err := rep.Attempts[0].Err; opError(err, "proxyconnect") == nil || !neverSent(err) {
			t.Errorf("first attempt: got %v; want a proxyconnect error that proves nothing was sent", err)
		}
	})
	t.Run("proxy answers CONNECT with 503", func(t *testing.T) {
		var origin atomic.Int32
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			origin.Add(1)
			io.WriteString(w, "ok")
		}))
		defer srv.Close()
		var connects atomic.Int32
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodConnect {
				http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
				return
			}
			if connects.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			tunnel(w, r.Host)
		}))
		defer proxy.Close()
		proxyURL, _ := url.Parse(proxy.URL)
		base := srv.Client().Transport.(*http.Transport).Clone()
		base.Proxy = http.ProxyURL(proxyURL)
		base.OnProxyConnectResponse = CheckProxyConnect
		defer base.CloseIdleConnections()
		tr := &Transport{Base: base, Policy: Policy{BaseDelay: time.Millisecond, NoIdempotencyKeys: true}}
		var rep Report
		req := mustReq(t, "POST", srv.URL)
		req = req.WithContext(WithReport(req.Context(), &rep))
		code, _, err := roundTrip(t, tr, req)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200 after the proxy's 503", code, err)
		}
		if connects.Load() != 2 || origin.Load() != 1 {
			t.Errorf("got %d CONNECTs and %d origin requests; want 2 and 1", connects.Load(), origin.Load())
		}
		var pe *ProxyConnectError
		if first := rep.Attempts[0]; !errors.As(first.Err, &pe) || pe.StatusCode != 503 || first.Class != Transient {
			t.Errorf("first attempt: got %v (%v); want a Transient *ProxyConnectError with status 503", first.Err, first.Class)
		}
	})
	t.Run("CONNECT statuses", func(t *testing.T) {
		for code, want := range map[int]Class{502: Transient, 503: Transient, 504: Transient, 429: Throttling, 407: Permanent, 403: Permanent} {
			err := CheckProxyConnect(context.Background(), nil, nil, &http.Response{StatusCode: code, Status: http.StatusText(code)})
			if got := DefaultClassify(nil, err); got != want {
				t.Errorf("CONNECT %d: got %v; want %v", code, got, want)
			}
		}
		if err := CheckProxyConnect(context.Background(), nil, nil, &http.Response{StatusCode: 200}); err != nil {
			t.Errorf("CONNECT 200: got %v; want nil", err)
		}
	})
}

// tunnel answers a CONNECT by relaying bytes to addr.
func tunnel(w http.ResponseWriter, addr string) {
	dst, err := net.Dial("tcp", addr)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	src, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		dst.Close()
		return
	}
	go func() {
		io.Copy(dst, buf)
		dst.Close()
	}()
	io.Copy(src, dst)
	src.Close()
}

func TestEmptyIdempotencyKeyIsNoKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(http.Header)
	}{
		{"canonical", func(h http.Header) { h.Set("Idempotency-Key", "") }},
		{"written in lower case", func(h http.Header) { h["idempotency-key"] = []string{""} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(rht.CommitThenDrop(), rht.Status(201))
				req := newReq(t, "POST", `{"amount":100}`)
				tc.set(req.Header)
				before := req.Header.Clone()
				code, _, err := roundTrip(t, &Transport{Base: base}, req)
				if err != nil || code != 201 {
					t.Fatalf("got (%d, %v); want 201", code, err)
				}
				rht.AssertAttempts(t, base, 2)
				rht.AssertStableKey(t, base)
				if _, err := uuid.Parse(base.Attempts()[0].Key); err != nil {
					t.Errorf("got key %q; want a generated UUID", base.Attempts()[0].Key)
				}
				for i, a := range base.Attempts() {
					n := 0
					for k, vs := range a.Header {
						if strings.EqualFold(k, "Idempotency-Key") {
							n += len(vs)
						}
					}
					if n != 1 {
						t.Errorf("attempt %d: got %d Idempotency-Key values; want 1", i+1, n)
					}
				}
				if got := base.Effects(); got != 1 {
					t.Errorf("got %d effects; want 1", got)
				}
				if !equalHeader(req.Header, before) {
					t.Errorf("the caller's header changed: got %v; want %v", req.Header, before)
				}
			})
		})
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, vs := range a {
		if strings.Join(vs, "\x00") != strings.Join(b[k], "\x00") {
			return false
		}
	}
	return true
}

// bothBase returns a response and an error together, as a broken base
// might, and counts the closes of the responses it hands out.
type bothBase struct {
	opened, closed atomic.Int32
	err            error
}

func (b *bothBase) RoundTrip(r *http.Request) (*http.Response, error) {
	b.opened.Add(1)
	return &http.Response{StatusCode: 200, Header: http.Header{}, Request: r,
		Body: closeTracker{strings.NewReader("x"), &b.closed}}, b.err
}

func TestBaseReturningResponseAndError(t *testing.T) {
	for _, p := range []Policy{{}, {AttemptTimeout: time.Second}} {
		t.Run("AttemptTimeout="+p.AttemptTimeout.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := &bothBase{err: errReset}
				p.Rand = lowRand
				resp, err := (&Transport{Base: base, Policy: p}).RoundTrip(newReq(t, "GET", ""))
				if resp != nil || !errors.Is(err, errReset) {
					t.Fatalf("got (%v, %v); want (nil, the base's error)", resp, err)
				}
				var re *Error
				if !errors.As(err, &re) || re.Attempts != 3 || re.Decision != StopAttempts {
					t.Errorf("got %v; want the error retried to StopAttempts after 3 attempts", err)
				}
				if o, c := base.opened.Load(), base.closed.Load(); o != 3 || c != 3 {
					t.Errorf("got %d responses, %d closed; want 3 and 3", o, c)
				}
			})
		})
	}
}

func TestErrorReportsTimeout(t *testing.T) {
	// As the http.Client sees it: (*url.Error).Timeout and errors.As to
	// net.Error must say "timeout" where the base's own error would.
	tests := []struct {
		name     string
		policy   Policy
		deadline time.Duration // the caller's, 0 for none
		want     bool
	}{
		{"caller's deadline", Policy{}, time.Second, true},
		{"Policy.Timeout", Policy{Timeout: time.Second}, 0, true},
		{"every attempt timed out", Policy{AttemptTimeout: time.Second, MaxAttempts: 2}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &Transport{Base: rht.NewTransport(rht.Hang()), Policy: tc.policy}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://x.test/", nil)
				_, err := (&http.Client{Transport: tr}).Do(req)
				var ue *url.Error
				if !errors.As(err, &ue) || ue.Timeout() != tc.want {
					t.Errorf("got %v (url.Error.Timeout %v); want Timeout() %v", err, ue != nil && ue.Timeout(), tc.want)
				}
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("errors.As(err, net.Error): got %v; want a net.Error reporting a timeout", ne)
				}
			})
		})
	}
	t.Run("not a timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := &Transport{Base: rht.NewTransport(rht.Step{Err: errReset}), Policy: Policy{MaxAttempts: 1}}
			_, err := tr.RoundTrip(newReq(t, "GET", ""))
			var re *Error
			if !errors.As(err, &re) || re.Timeout() {
				t.Errorf("got %v; want an *Error that is not a timeout", err)
			}
		})
	})
}

// closeTracker is a request body that records its Close.
type closeTracker struct {
	io.Reader
	closed *atomic.Int32
}

func (c closeTracker) Close() error { c.closed.Add(1); return nil }

func TestPanickingHooksCleanUp(t *testing.T) {
	// A hook's panic goes on to the caller, but nothing stays open or
	// spent: the response body, the Timeout, the next attempt's body, the
	// retry's tokens.
	tests := []struct {
		name string
		tr   func() *Transport
	}{
		{"Classify", func() *Transport {
			return &Transport{Policy: Policy{Classify: func(*http.Response, error) Class { panic("classify") }}}
		}},
		{"OnAttempt after a Retry decision", func() *Transport {
			return &Transport{OnAttempt: func(a Attempt) {
				if a.Decision == Retry {
					panic("hook")
				}
			}}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(rht.Status(503).WithBody("busy"), rht.Status(200))
				var ctxs []context.Context
				tr := tc.tr()
				tr.Base = roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					ctxs = append(ctxs, r.Context())
					return base.RoundTrip(r)
				})
				tr.Policy.Timeout = time.Minute
				var replays atomic.Int32
				req := newReq(t, "PUT", "payload")
				req.GetBody = func() (io.ReadCloser, error) {
					return closeTracker{strings.NewReader("payload"), &replays}, nil
				}
				func() {
					defer func() {
						if recover() == nil {
							t.Error("got no panic; want the hook's panic to reach the caller")
						}
					}()
					tr.RoundTrip(req)
				}()
				if got := base.OpenBodies(); got != 0 {
					t.Errorf("got %d open response bodies; want 0", got)
				}
				if err := ctxs[0].Err(); err == nil {
					t.Error("the Timeout's context is still running; want it released")
				}
				if got := tr.BudgetInUse().Available(); got != DefaultBudgetTokens {
					t.Errorf("got %d tokens; want %d (no retry was made)", got, DefaultBudgetTokens)
				}
				if got := replays.Load(); tc.name != "Classify" && got != 1 {
					t.Errorf("got the replay body closed %d times; want 1", got)
				}
			})
		})
	}
}

func TestCanceledWaitReturnsItsTokens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := &Transport{Base: rht.NewTransport(rht.Status(503)), Policy: Policy{Rand: highRand}}
		for range 10 {
			ctx, cancel := context.WithCancel(context.Background())
			req := newReq(t, "GET", "").WithContext(ctx)
			time.AfterFunc(10*time.Millisecond, cancel) // during the 50ms wait
			_, err := tr.RoundTrip(req)
			var re *Error
			if !errors.As(err, &re) || re.Decision != StopCanceled || re.Attempts != 1 {
				t.Fatalf("got %v; want StopCanceled after 1 attempt", err)
			}
			cancel()
		}
		if got := tr.BudgetInUse().Available(); got != DefaultBudgetTokens {
			t.Errorf("got %d tokens after 10 canceled waits; want %d", got, DefaultBudgetTokens)
		}
	})
}

func TestUpgradedConnectionOutlivesTimeout(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(conn, buf) // echo
	}))
	defer srv.Close()
	tr := &Transport{Policy: Policy{Timeout: 50 * time.Millisecond}}
	defer tr.CloseIdleConnections()
	req := mustReq(t, "GET", srv.URL)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := tr.RoundTrip(req)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("got (%v, %v); want 101", resp, err)
	}
	defer resp.Body.Close()
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("got a %T body; want net/http's writable one", resp.Body)
	}
	time.Sleep(100 * time.Millisecond) // past the Timeout
	if _, err := io.WriteString(rw, "ping\n"); err != nil {
		t.Fatalf("write after the Timeout: %v", err)
	}
	line, err := bufio.NewReader(rw).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Errorf("got (%q, %v) after the Timeout; want the echo", line, err)
	}
}

func TestReport(t *testing.T) {
	t.Run("a 503 returned after the budget ran out", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := &Transport{Base: rht.NewTransport(rht.Status(503)), Budget: NewBudget(RetryCost), Policy: Policy{Rand: highRand}}
			var rep Report
			req := newReq(t, "GET", "")
			req = req.WithContext(WithReport(req.Context(), &rep))
			code, _, err := roundTrip(t, tr, req)
			if err != nil || code != 503 {
				t.Fatalf("got (%d, %v); want the 503 with a nil error", code, err)
			}
			if rep.Decision != StopBudget || len(rep.Attempts) != 2 || rep.Retries() != 1 || rep.Waited != 50*time.Millisecond {
				t.Errorf("got decision %v, %d attempts, %d retries, waited %v; want StopBudget, 2, 1, 50ms",
					rep.Decision, len(rep.Attempts), rep.Retries(), rep.Waited)
			}
			if a := rep.Attempts[0]; a.Status != 503 || a.Decision != Retry || a.Delay != 50*time.Millisecond {
				t.Errorf("attempt 1: got %v; want 503 -> retry in 50ms", a)
			}
		})
	})
	t.Run("canceled during the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := &Transport{Base: rht.NewTransport(rht.Status(503)), Policy: Policy{Rand: highRand}}
			var rep Report
			ctx, cancel := context.WithCancel(WithReport(context.Background(), &rep))
			defer cancel()
			time.AfterFunc(10*time.Millisecond, cancel) // during the 50ms wait
			req := newReq(t, "GET", "").WithContext(ctx)
			if _, err := tr.RoundTrip(req); err == nil {
				t.Fatal("got a response; want an error")
			}
			if rep.Decision != StopCanceled || len(rep.Attempts) != 1 || rep.Waited != 0 {
				t.Errorf("got %v after %d attempts, waited %v; want StopCanceled after 1, waited 0", rep.Decision, len(rep.Attempts), rep.Waited)
			}
		})
	})
	t.Run("no report: nothing recorded", func(t *testing.T) {
		if reportFrom(context.Background()) != nil {
			t.Error("got a Report from a bare context; want nil")
		}
	})
}
