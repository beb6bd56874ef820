package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// Faults over real loopback connections. Real time: delays are milliseconds.

func TestResponsesOverLoopback(t *testing.T) {
	t.Run("reset mid-body of the final response reaches the caller's read", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000000")
			w.WriteHeader(200)
			io.WriteString(w, strings.Repeat("x", 1000))
			w.(http.Flusher).Flush()
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}))
		defer srv.Close()
		tr := &Transport{Policy: fast}
		resp, err := tr.RoundTrip(mustReq(t, "GET", srv.URL))
		if err != nil {
			t.Fatalf("got %v; want the response (its headers arrived)", err)
		}
		_, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if rerr == nil {
			t.Error("got a clean read of a cut body; want an error")
		}
	})
	t.Run("reset mid-body of a discarded 503", func(t *testing.T) {
		var n atomic.Int32
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1) > 1 {
				io.WriteString(w, "ok")
				return
			}
			w.Header().Set("Content-Length", "1000000")
			w.WriteHeader(503)
			io.WriteString(w, "partial")
			w.(http.Flusher).Flush()
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
		}))
		defer srv.Close()
		code, body, err := roundTrip(t, &Transport{Policy: fast}, mustReq(t, "GET", srv.URL))
		if err != nil || code != 200 || body != "ok" {
			t.Errorf("got (%d, %q, %v); want (200, ok, nil)", code, body, err)
		}
	})
	t.Run("HEAD 503 is retried", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Status(503), rht.Status(200))
		code, body, err := roundTrip(t, &Transport{Policy: fast}, mustReq(t, "HEAD", srv.URL))
		if err != nil || code != 200 || body != "" {
			t.Errorf("got (%d, %q, %v); want (200, \"\", nil)", code, body, err)
		}
		rht.AssertAttempts(t, srv, 2)
	})
	t.Run("204 is a success", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Status(204))
		code, _, err := roundTrip(t, &Transport{Policy: fast}, mustReq(t, "DELETE", srv.URL))
		if err != nil || code != 204 {
			t.Errorf("got (%d, %v); want (204, nil)", code, err)
		}
		rht.AssertAttempts(t, srv, 1)
	})
	t.Run("a redirect inside a retried request", func(t *testing.T) {
		target := rht.NewServer(t, rht.Status(503), rht.Status(200).WithBody("moved here"))
		origin := rht.NewServer(t, rht.Status(503), rht.Status(302).WithHeader("Location", target.URL+"/b"))
		client := &http.Client{Transport: &Transport{Policy: fast}}
		resp, err := client.Post(origin.URL+"/a", "text/plain", strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "moved here" {
			t.Errorf("got (%d, %q); want (200, moved here)", resp.StatusCode, b)
		}
		// Each hop is its own RoundTrip: retried on its own, with its own key.
		rht.AssertAttempts(t, origin, 2)
		rht.AssertAttempts(t, target, 2)
		rht.AssertStableKey(t, origin)
		if got := target.Attempts()[0]; got.Method != "GET" || got.Key != "" {
			t.Errorf("got the redirected %s with key %q; want a GET (302 after POST) with no key", got.Method, got.Key)
		}
	})
}

func TestHangingServer(t *testing.T) {
	t.Run("per-attempt timeout: retried while the deadline allows", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Hang().Times(2), rht.Status(200).WithBody("finally"))
		var errs []error
		tr := &Transport{Policy: Policy{AttemptTimeout: 100 * time.Millisecond, Timeout: 5 * time.Second, BaseDelay: time.Millisecond},
			OnAttempt: func(a Attempt) { errs = append(errs, a.Err) }}
		code, body, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		if err != nil || code != 200 || body != "finally" {
			t.Fatalf("got (%d, %q, %v); want (200, finally, nil)", code, body, err)
		}
		if len(errs) != 3 || !errors.Is(errs[0], ErrAttemptTimeout) || !errors.Is(errs[1], ErrAttemptTimeout) {
			t.Errorf("got attempt errors %v; want two ErrAttemptTimeout, then success", errs)
		}
	})
	t.Run("per-attempt timeout: the overall deadline ends it", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Hang())
		tr := &Transport{Policy: Policy{AttemptTimeout: 100 * time.Millisecond, Timeout: 250 * time.Millisecond, MaxAttempts: 10, BaseDelay: time.Millisecond}}
		start := time.Now()
		_, _, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		if took := time.Since(start); took > time.Second {
			t.Errorf("took %v; want about 250ms", took)
		}
		var re *Error
		if !errors.As(err, &re) || (re.Decision != StopCanceled && re.Decision != StopDeadline) {
			t.Errorf("got %v; want an *Error stopped by the deadline", err)
		}
	})
	t.Run("no per-attempt timeout: the caller's deadline ends it", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Hang())
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		_, _, err := roundTrip(t, &Transport{Policy: fast}, mustReq(t, "GET", srv.URL).WithContext(ctx))
		var re *Error
		if !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &re) || re.Decision != StopCanceled || re.Attempts != 1 {
			t.Errorf("got %v; want %v after 1 attempt, wrapping DeadlineExceeded", err, StopCanceled)
		}
	})
}

// generator is a request body of n bytes made on the fly: nothing of it is
// held in memory.
type generator struct{ left int64 }

func (g *generator) Read(p []byte) (int, error) {
	if g.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), g.left)
	clear(p[:n])
	g.left -= n
	return int(n), nil
}

func TestLargeRequestBodyIsStreamed(t *testing.T) {
	const size = 64 << 20
	var received []int64
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		received = append(received, n)
		if calls.Add(1) == 1 {
			w.WriteHeader(503)
		}
	}))
	defer srv.Close()
	req, _ := http.NewRequest("PUT", srv.URL, &generator{left: size})
	req.ContentLength = size
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(&generator{left: size}), nil }

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	code, _, err := roundTrip(t, &Transport{Policy: fast}, req)
	runtime.ReadMemStats(&after)
	if err != nil || code != 200 {
		t.Fatalf("got (%d, %v); want (200, nil)", code, err)
	}
	if fmt.Sprint(received) != fmt.Sprint([]int64{size, size}) {
		t.Errorf("got bodies of %v bytes; want two of %d", received, size)
	}
	// Two 64 MiB uploads; a transport that buffered them would allocate 128 MiB.
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 8<<20 {
		t.Errorf("allocated %d bytes to send 128 MiB; want under 8 MiB", grew)
	}
}

// TestExactlyOnce: a POST whose handler commits, after which the connection
// is cut before any response. With HTTP/1.1 on a new connection, the retry is
// ours; on a reused keep-alive connection net/http replays the request itself
// (it carries an Idempotency-Key), inside our one attempt. With HTTP/2 the
// cut is a stream reset (INTERNAL_ERROR), which we retry. Every time, the
// server sees the same key and performs the write once.
func TestExactlyOnce(t *testing.T) {
	tests := []struct {
		name           string
		http2          bool
		warm           bool // a request first, so the POST reuses the connection
		serverAttempts int
		ourAttempts    int
	}{
		{"HTTP/1.1 new connection", false, false, 2, 2},
		{"HTTP/1.1 reused connection", false, true, 2, 1},
		{"HTTP/2", true, false, 2, 2},
		{"HTTP/2 reused connection", true, true, 2, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var steps []rht.Step
			if tc.warm {
				steps = append(steps, rht.Status(200))
			}
			srv := rht.NewUnstartedServer(t, append(steps, rht.CommitThenDrop(), rht.Status(201))...)
			base := start(t, srv, tc.http2)
			ours := 0
			tr := &Transport{Base: base, Policy: fast, OnAttempt: func(a Attempt) {
				if a.Request.Method == "POST" {
					ours++
				}
			}}
			if tc.warm {
				roundTrip(t, tr, mustReq(t, "GET", srv.URL+"/warm"))
			}
			code, _, err := roundTrip(t, tr, mustReq(t, "POST", srv.URL+"/charges"))
			if err != nil || code != 201 {
				t.Fatalf("got (%d, %v); want (201, nil)", code, err)
			}
			var posts []rht.Attempt
			for _, a := range srv.Attempts() {
				if a.Method == "POST" {
					posts = append(posts, a)
				}
			}
			t.Logf("server saw %d POST attempts, the Transport made %d, effects %d", len(posts), ours, srv.Effects())
			if len(posts) != tc.serverAttempts || ours != tc.ourAttempts {
				t.Errorf("got %d attempts at the server and %d of ours; want %d and %d", len(posts), ours, tc.serverAttempts, tc.ourAttempts)
			}
			if posts[0].Key == "" || posts[0].Key != posts[len(posts)-1].Key {
				t.Errorf("got keys %q then %q; want one key", posts[0].Key, posts[len(posts)-1].Key)
			}
			if srv.Effects() != 1 {
				t.Errorf("got %d effects; want exactly 1", srv.Effects())
			}
		})
	}
}

func TestFinalBodyReadableToTheEnd(t *testing.T) {
	big := strings.Repeat("0123456789abcdef", 1<<17) // 2 MiB
	for _, tc := range []struct {
		name  string
		http2 bool
	}{{"HTTP/1.1", false}, {"HTTP/2", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := rht.NewUnstartedServer(t, rht.Status(503), rht.Status(200).WithBody(big))
			base := start(t, srv, tc.http2)
			// The attempt timeout leaves room for a TLS handshake on a busy
			// CI machine; the body is then read for longer than it.
			const attemptTimeout = 300 * time.Millisecond
			tr := &Transport{Base: base, Policy: Policy{AttemptTimeout: attemptTimeout, Timeout: 30 * time.Second, BaseDelay: time.Millisecond}}
			resp, err := tr.RoundTrip(mustReq(t, "GET", srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if tc.http2 && resp.ProtoMajor != 2 {
				t.Fatalf("got HTTP/%d; want HTTP/2", resp.ProtoMajor)
			}
			// Read slowly, well past the per-attempt timeout.
			var got strings.Builder
			buf := make([]byte, 256<<10)
			start := time.Now()
			for {
				n, err := resp.Body.Read(buf)
				got.Write(buf[:n])
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("read %d bytes, then %v; want the whole body", got.Len(), err)
				}
				time.Sleep(attemptTimeout / 4)
			}
			if got.String() != big {
				t.Errorf("got %d bytes; want %d", got.Len(), len(big))
			}
			if took := time.Since(start); took < attemptTimeout {
				t.Errorf("read the body in %v; the test needs longer than the %v attempt timeout", took, attemptTimeout)
			}
		})
	}
}
