package retryhttp

import (
	"context"
	"errors"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

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

// countingReader yields n bytes of 'x' without holding them, and counts what
// was read.
type countingReader struct {
	left, read int64
	failAfter  int64 // > 0: fail once this many bytes were read
	closed     atomic.Bool
}

var errMidBody = errors.New("body broke mid-read")

func (r *countingReader) Read(p []byte) (int, error) {
	if r.failAfter > 0 && r.read >= r.failAfter {
		return 0, errMidBody
	}
	if r.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.left)
	if r.failAfter > 0 {
		n = min(n, r.failAfter-r.read)
	}
	for i := range p[:n] {
		p[i] = 'x'
	}
	r.left -= n
	r.read += n
	return int(n), nil
}

func (r *countingReader) Close() error { r.closed.Store(true); return nil }

// bodyBase answers the first attempt with a 503 carrying the given body and
// every later one with a 200.
type bodyBase struct {
	body  io.ReadCloser
	calls atomic.Int32
}

func (b *bodyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.calls.Add(1) == 1 {
		return &http.Response{StatusCode: 503, Header: http.Header{}, Body: b.body, Request: req}, nil
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

func TestDiscardedBodies(t *testing.T) {
	t.Run("a 10 MB body is drained only to the limit", func(t *testing.T) {
		body := &countingReader{left: 10 << 20}
		tr := &Transport{Base: &bodyBase{body: body}, Policy: Policy{Rand: lowRand}}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		runtime.ReadMemStats(&after)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want (200, nil)", code, err)
		}
		if body.read != drainLimit {
			t.Errorf("got %d bytes drained; want %d", body.read, drainLimit)
		}
		if !body.closed.Load() {
			t.Error("the discarded body was not closed")
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<10 {
			t.Errorf("got %d bytes allocated for a retry over a 10 MB body; want under 256 KiB", grew)
		}
	})
	t.Run("a body that breaks mid-read is closed and the retry goes on", func(t *testing.T) {
		body := &countingReader{left: 1 << 20, failAfter: 100}
		tr := &Transport{Base: &bodyBase{body: body}, Policy: Policy{Rand: lowRand}}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || code != 200 || !body.closed.Load() {
			t.Errorf("got (%d, %v, closed %v); want (200, nil, closed)", code, err, body.closed.Load())
		}
	})
	t.Run("a 10 MB 503 over loopback", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Status(503).WithBody(strings.Repeat("x", 10<<20)), rht.Status(200).WithBody("ok"))
		tr := &Transport{Policy: fast}
		code, body, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		if err != nil || code != 200 || body != "ok" {
			t.Errorf("got (%d, %q, %v); want (200, ok, nil)", code, body, err)
		}
		// Not drained to the end: that connection was closed, a new one made.
		if got := srv.Conns(); got != 2 {
			t.Errorf("got %d connections; want 2", got)
		}
	})
}
