package retryhttp

import (
	"bytes"
	"context"
	"errors"
	rht "github.com/herdproof/retryhttp/retryhttptest"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// These tests use real loopback connections and so real time; their waits
// are kept to milliseconds.

func TestZeroTransportInHTTPClient(t *testing.T) {
	srv := rht.NewServer(t, rht.Status(503), rht.Status(503), rht.Status(200).WithBody("hello"))
	client := &http.Client{Transport: &Transport{}}
	resp, err := client.Get(srv.URL)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "hello" {
		t.Errorf("got (%d, %q); want (200, \"hello\")", resp.StatusCode, b)
	}
	if n := len(srv.Attempts()); n != 3 {
		t.Errorf("got %d attempts at the server; want 3", n)
	}
	for i, g := range rht.Gaps(srv) {
		// Full jitter: retry n waits at most 50ms * 2^n, plus the attempt
		// and generous room for a busy machine.
		if hi := (50 * time.Millisecond << i) + 500*time.Millisecond; g > hi {
			t.Errorf("wait %d: got %v; want at most about %v", i, g, hi)
		}
	}
}

func TestCommittedWriteWithLostResponse(t *testing.T) {
	// The handler performs the write, then the connection is cut before any
	// response: to the client it is a network error, indistinguishable from
	// a write that never happened.
	tests := []struct {
		name        string
		policy      Policy
		wantStatus  int
		wantErr     bool
		wantAttempt int
	}{
		{"retried with the same key: one effect", fast, 200, false, 2},
		{"keys off: not retried", Policy{NoIdempotencyKeys: true}, 0, true, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := rht.NewServer(t, rht.CommitThenDrop(), rht.Status(200))
			client := &http.Client{Transport: &Transport{Policy: tc.policy}}
			resp, err := client.Post(srv.URL+"/charges", "application/json", bytes.NewReader([]byte(`{"amount":100}`)))
			if tc.wantErr {
				if err == nil {
					resp.Body.Close()
					t.Fatalf("got %d; want an error", resp.StatusCode)
				}
			} else {
				require.NoError(t, err)
				resp.Body.Close()
				if resp.StatusCode != tc.wantStatus {
					t.Errorf("got %d; want %d", resp.StatusCode, tc.wantStatus)
				}
			}
			if got := len(srv.Attempts()); got != tc.wantAttempt {
				t.Errorf("got %d attempts at the server; want %d", got, tc.wantAttempt)
			}
			if got := srv.Effects(); got != 1 {
				t.Errorf("got %d effects; want exactly 1", got)
			}
			keys := rht.Keys(srv)
			for _, k := range keys {
				if k != keys[0] {
					t.Errorf("got keys %q; want one key on every attempt", keys)
				}
			}
			if !tc.wantErr && keys[0] == "" {
				t.Error("got no idempotency key; want one")
			}
		})
	}
}

func TestRealNetworkFailures(t *testing.T) {
	t.Run("reset before the response", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Reset(), rht.Status(200))
		tr := &Transport{Policy: fast}
		code, _, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		if err != nil || code != 200 || len(srv.Attempts()) != 2 {
			t.Errorf("got (%d, %v) after %d attempts; want (200, nil) after 2", code, err, len(srv.Attempts()))
		}
	})
	t.Run("connection refused is retried, then reported", func(t *testing.T) {
		url := closedURL(t)
		var hooks []Attempt
		tr := &Transport{Policy: fast, OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
		_, _, err := roundTrip(t, tr, mustReq(t, "GET", url))
		var re *Error
		if !errors.As(err, &re) || re.Attempts != 3 || re.Decision != StopAttempts {
			t.Fatalf("got %v; want an *Error after 3 attempts, %v", err, StopAttempts)
		}
		var opErr *net.OpError
		if !errors.As(err, &opErr) || opErr.Op != "dial" {
			t.Errorf("got %v; want it to wrap the dial *net.OpError", err)
		}
		for i, h := range hooks {
			if h.Class != Transient {
				t.Errorf("attempt %d: got class %v; want transient", i+1, h.Class)
			}
		}
	})
	t.Run("connection refused: a POST with keys off is retried", func(t *testing.T) {
		url := closedURL(t)
		n := 0
		tr := &Transport{Policy: Policy{NoIdempotencyKeys: true, BaseDelay: time.Millisecond}, OnAttempt: func(Attempt) { n++ }}
		roundTrip(t, tr, mustReq(t, "POST", url))
		if n != 3 {
			t.Errorf("got %d attempts; want 3 (a refused connection proves nothing was sent)", n)
		}
	})
	t.Run("connections are reused across retries", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Status(503), rht.Status(200), rht.Status(503), rht.Status(200), rht.Status(503), rht.Status(200))
		tr := &Transport{Policy: fast}
		for range 3 {
			roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		}
		if got := srv.Conns(); got != 1 {
			t.Errorf("got %d connections for 6 attempts; want 1", got)
		}
	})
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
