package retryhttp

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
	"github.com/stretchr/testify/require"
)

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
		{"keys off: not retried", Policy{NewIdempotencyKey: noKey}, 0, true, 1},
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
		tr := &Transport{Policy: Policy{NewIdempotencyKey: noKey, BaseDelay: time.Millisecond}, OnAttempt: func(Attempt) { n++ }}
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

// TestSharedTransportUnderLoad: 1,000 goroutines share one Transport against
// a loopback server that fails 30% of attempts. Every request gets a result,
// every write one key of its own, and the budget ends exactly where the
// attempt log says it must.
func TestSharedTransportUnderLoad(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		// Attempt i fails when (i*7) mod 10 < 3: 30%, spread evenly.
		if (n.Add(1)*7)%10 < 3 {
			w.WriteHeader(503)
			return
		}
		io.WriteString(w, r.Header.Get(defaultIdempotencyHeader))
	}))
	defer srv.Close()

	// A bucket half full of 100,000 tokens: 1,000 requests can neither fill
	// it (at most +1,000) nor empty it (at most -28,000), so every refill
	// and every cost counts whole, and the final count follows exactly from
	// the attempt log. (Draining is TestSustainedOutage's subject.)
	budget := newTokenBucket(100_000)
	budget.take(50_000)
	var mu sync.Mutex
	var log []Attempt
	tr := &Transport{Budget: budget, Policy: Policy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
		OnAttempt: func(a Attempt) {
			if a.tokens < 0 || a.tokens > budget.size() {
				t.Errorf("got %d tokens; want within [0, %d]", a.tokens, budget.size())
			}
			mu.Lock()
			log = append(log, a)
			mu.Unlock()
		}}
	client := &http.Client{Transport: tr}

	const workers = 1000
	keys := make([]string, workers)
	var wg sync.WaitGroup
	var results, fails atomic.Int64
	for i := range workers {
		wg.Go(func() {
			resp, err := client.Post(srv.URL, "text/plain", strings.NewReader(fmt.Sprint(i)))
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results.Add(1)
			if resp.StatusCode == 200 {
				keys[i] = string(b)
			} else {
				fails.Add(1)
			}
		})
	}
	wg.Wait()
	if results.Load() != workers {
		t.Fatalf("got %d results; want %d", results.Load(), workers)
	}
	seen := map[string]bool{}
	for _, k := range keys {
		if k == "" {
			continue
		}
		if seen[k] {
			t.Errorf("key %s served two requests; want one key per request", k)
		}
		seen[k] = true
	}

	// Replay the log: +1 for a first-try success, -cost for a retry paid,
	// +cost back for the success that followed it.
	want := 50_000
	retries := 0
	for _, a := range log {
		switch {
		case a.Decision == Retry:
			c := RetryCost
			if a.Class == Throttling {
				c = ThrottleRetryCost
			}
			want -= c
			retries++
		case a.Class == Success && a.Number == 1:
			want++
		case a.Class == Success:
			want += prevCost(log, a)
		}
	}
	if got := budget.Available(); got != want {
		t.Errorf("got %d tokens at the end; want %d from the attempt log", got, want)
	}
	hist := map[string]int{}
	for _, a := range log {
		hist[a.Class.String()+"/"+a.Decision.String()]++
	}
	t.Logf("%d requests, %d attempts, %d retries, %d ended on 503, %d tokens left; %v", workers, len(log), retries, fails.Load(), budget.Available(), hist)
}

// prevCost finds the cost of the retry that led to success a: the Retry
// decision of the attempt before it with the same idempotency key.
func prevCost(log []Attempt, a Attempt) int {
	key := a.Request.Header.Get(defaultIdempotencyHeader)
	for _, p := range log {
		if p.Number == a.Number-1 && p.Decision == Retry && p.Request.Header.Get(defaultIdempotencyHeader) == key {
			if p.Class == Throttling {
				return ThrottleRetryCost
			}
			return RetryCost
		}
	}
	panic("no retry before a success after the first attempt")
}

func TestConnectionsReusedAcrossRetries(t *testing.T) {
	steps := []rht.Step{}
	for range 250 {
		steps = append(steps, rht.Status(503), rht.Status(200))
	}
	srv := rht.NewServer(t, steps...)
	tr := &Transport{Policy: fast, Budget: newTokenBucket(math.MaxInt)}
	for range 250 {
		code, _, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want (200, nil)", code, err)
		}
	}
	rht.AssertAttempts(t, srv, 500)
	if got := srv.Conns(); got != 1 {
		t.Errorf("got %d TCP connections for 500 attempts; want 1", got)
	}
}

func runtimeGoroutines() int { return runtime.NumGoroutine() }

// Many goroutines share one outer
// Transport (hedging, SendAttemptHeader, Timeout, a Limiter, a ledger
// budget, OnAttempt, Report) over an inner hedging Transport over real
// loopback HTTP/1.1 and HTTP/2; the server answers 503, 429 or 200 after
// varying delays. No data race, every payment settled at most once, every
// Report consistent, and the goroutine count returns to where it was.
func TestSharedTransportNestedHedging(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", h2), func(t *testing.T) {
			before := runtimeGoroutines()
			var n atomic.Int64
			srv := rht.NewUnstartedServer(t)
			srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				i := n.Add(1)
				select {
				case <-time.After(time.Duration(i%7) * time.Millisecond):
				case <-r.Context().Done():
					return
				}
				switch i % 10 {
				case 0, 1:
					w.WriteHeader(503)
					io.WriteString(w, strings.Repeat("x", 100<<10)) // longer than the drain
				case 2:
					w.WriteHeader(429)
				default:
					io.WriteString(w, "ok")
				}
			})
			base := start(t, srv, h2)
			inner := &Transport{Base: base, Policy: Policy{HedgeDelay: 3 * time.Millisecond, HedgeRatio: 1, BaseDelay: time.Millisecond, ThrottleBaseDelay: time.Millisecond}}
			budget := newLedger(t)
			var attempts atomic.Int64
			outer := &Transport{Base: inner, Budget: budget, Limiter: &RateLimiter{},
				Policy: Policy{HedgeDelay: 4 * time.Millisecond, HedgeRatio: 1, MaxHedges: 2, MaxAttempts: 4, SendAttemptHeader: true,
					Timeout: 5 * time.Second, BaseDelay: time.Millisecond, ThrottleBaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
				OnAttempt: func(Attempt) { attempts.Add(1) }}
			var wg sync.WaitGroup
			for g := range 20 {
				wg.Go(func() {
					for i := range 6 {
						var rep Report
						method := []string{"GET", "PUT", "POST"}[(g+i)%3]
						req, _ := http.NewRequest(method, srv.URL, strings.NewReader("payload"))
						req = req.WithContext(WithReport(req.Context(), &rep))
						resp, err := outer.RoundTrip(req)
						if (resp == nil) == (err == nil) {
							t.Errorf("got (%v, %v); want one of them", resp, err)
							return
						}
						if resp != nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
						if len(rep.History) == 0 && err == nil {
							t.Errorf("a response with an empty Report")
						}
					}
				})
			}
			wg.Wait()
			budget.check(t)
			outer.CloseIdleConnections()
			base.CloseIdleConnections()
			srv.Close()
			var after int
			for range 100 {
				if after = runtimeGoroutines(); after <= before {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if after > before {
				t.Errorf("got %d goroutines after; want at most %d as before", after, before)
			}
			t.Logf("%d server requests, %d outer attempts", n.Load(), attempts.Load())
		})
	}
}

// Over real loopback HTTP/1.1 and HTTP/2, a hedged
// PUT whose first copy stalls mid-upload (the server reads nothing from
// it) and whose hedge wins: every request body (the caller's and each from
// GetBody) is closed exactly once, and the loser's stream or connection
// goes away without leaking goroutines.
func TestHedgedUploadOverLoopback(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprintf("http2=%v", h2), func(t *testing.T) {
			before := runtimeGoroutines()
			var n atomic.Int32
			stop := make(chan struct{})
			srv := rht.NewUnstartedServer(t)
			srv.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if n.Add(1) == 1 {
					// Never reads the upload. (An HTTP/1.1 server that reads
					// nothing does not see the client go away: stop ends it.)
					select {
					case <-r.Context().Done():
					case <-stop:
					}
					return
				}
				io.Copy(io.Discard, r.Body)
				io.WriteString(w, "hedge")
			})
			base := start(t, srv, h2)
			tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 20 * time.Millisecond, HedgeRatio: 1, Timeout: 10 * time.Second}}
			payload := strings.Repeat("p", 256<<10) // under HTTP/2's connection window (see the report)
			var closed, replays, replayed atomic.Int32
			req, _ := http.NewRequest("PUT", srv.URL, closeTracker{strings.NewReader(payload), &closed})
			req.ContentLength = int64(len(payload))
			req.GetBody = func() (io.ReadCloser, error) {
				replayed.Add(1)
				return closeTracker{strings.NewReader(payload), &replays}, nil
			}
			code, body, err := roundTrip(t, tr, req)
			if err != nil || code != 200 || body != "hedge" {
				t.Fatalf("got (%d, %q, %v); want the hedge's 200", code, body, err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for time.Now().Before(deadline) && (closed.Load() != 1 || replays.Load() != replayed.Load()) {
				time.Sleep(10 * time.Millisecond)
			}
			if got := closed.Load(); got != 1 {
				t.Errorf("got the caller's body closed %d times; want 1", got)
			}
			if got, want := replays.Load(), replayed.Load(); got != want || want != 1 {
				t.Errorf("got %d GetBody bodies closed of %d; want 1 of 1", got, want)
			}
			close(stop)
			base.CloseIdleConnections()
			srv.Close()
			var after int
			for range 100 {
				if after = runtimeGoroutines(); after <= before {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			if after > before {
				t.Errorf("got %d goroutines after; want at most %d as before", after, before)
			}
		})
	}
}

// A hedged upgrade over loopback HTTP/1.1: the
// hedge's 101 wins, its copy's context is released at once, and the
// upgraded connection stays the caller's, past the Timeout; the loser's late
// 101 is closed.
func TestHedgedUpgrade(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			time.Sleep(80 * time.Millisecond)
		}
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		io.WriteString(conn, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		io.Copy(conn, buf)
	}))
	defer srv.Close()
	tr := &Transport{Policy: Policy{HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1, Timeout: 50 * time.Millisecond}}
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
		t.Fatalf("got a %T body; want a writable one", resp.Body)
	}
	time.Sleep(150 * time.Millisecond) // past the Timeout and the loser's answer
	if _, err := io.WriteString(rw, "ping\n"); err != nil {
		t.Fatalf("write: %v", err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(rw, buf); err != nil || string(buf) != "ping\n" {
		t.Errorf("got (%q, %v); want the echo", buf, err)
	}
}

// Everything on, many goroutines, over a real client and server: the
// caller's request is never touched and -race stays quiet.
func TestConcurrentEverythingThroughAClient(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		switch n.Add(1) % 4 {
		case 0:
			w.WriteHeader(503)
		case 1:
			time.Sleep(3 * time.Millisecond)
		case 2:
			if r.URL.Path == "/a" { // one redirect at most: "/b" is never redirected
				http.Redirect(w, r, "/b", 307)
				return
			}
		}
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	tr := &Transport{Policy: Policy{BaseDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, Timeout: 5 * time.Second,
		HedgeDelay: time.Millisecond, HedgeRatio: 1, SendAttemptHeader: true, MaxAttempts: 4},
		OnAttempt: func(Attempt) {}}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	done := make(chan struct{})
	for i := 0; i < 16; i++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for j := 0; j < 20; j++ {
				method := []string{"GET", "POST", "PUT"}[j%3]
				req, _ := http.NewRequest(method, srv.URL+"/a", strings.NewReader("body"))
				req.Header.Set("X-Mine", "1")
				var rep Report
				req = req.WithContext(WithOverride(WithReport(context.Background(), &rep), Override{AttemptTimeout: time.Second}))
				h := fmt.Sprint(req.Header)
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					for _, a := range rep.History {
						t.Logf("  %v err=%v hedges=%d won=%v", a, a.Err, a.Hedges, a.HedgeWon)
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if fmt.Sprint(req.Header) != h {
					t.Errorf("caller's header changed: %v -> %v", h, req.Header)
				}
			}
		}()
	}
	for i := 0; i < 16; i++ {
		<-done
	}
}

// A 307 redirect of a POST with a body, whose target fails once with a 503:
// the retry on the redirected hop must send the whole body again.
func TestRetryOnARedirectedHop(t *testing.T) {
	for _, code := range []int{307, 308} {
		t.Run(fmt.Sprint(code), func(t *testing.T) {
			var hits atomic.Int32
			var bodies []string
			mux := http.NewServeMux()
			mux.HandleFunc("/from", func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				http.Redirect(w, r, "/to", code)
			})
			mux.HandleFunc("/to", func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				bodies = append(bodies, string(b))
				if hits.Add(1) == 1 {
					w.WriteHeader(503)
					return
				}
				io.WriteString(w, "ok")
			})
			srv := httptest.NewServer(mux)
			defer srv.Close()
			client := &http.Client{Transport: &Transport{Policy: fast}}
			req, _ := http.NewRequest("POST", srv.URL+"/from", strings.NewReader("payload"))
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "ok" {
				t.Errorf("got %d %q; want 200 ok", resp.StatusCode, b)
			}
			if len(bodies) != 2 || bodies[0] != "payload" || bodies[1] != "payload" {
				t.Errorf("target got bodies %q; want [payload payload]", bodies)
			}
			if req.Header.Get("Idempotency-Key") != "" {
				t.Errorf("caller's request got a key")
			}
		})
	}
}

// Expect: 100-continue: a server that answers 503 without reading the body
// (so no 100 Continue is sent), then 200: the retry sends the body.
func TestExpectContinueRetry(t *testing.T) {
	var hits atomic.Int32
	var last atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.WriteHeader(503)
			return
		}
		b, _ := io.ReadAll(r.Body)
		last.Store(string(b))
		io.WriteString(w, "ok")
	}))
	defer srv.Close()
	base := &http.Transport{ExpectContinueTimeout: 5 * time.Second}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: &Transport{Base: base, Policy: fast}}
	req, _ := http.NewRequest("PUT", srv.URL, strings.NewReader("payload"))
	req.Header.Set("Expect", "100-continue")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || last.Load() != "payload" {
		t.Errorf("got %d, body at server %v; want 200, payload", resp.StatusCode, last.Load())
	}
}

func TestHeadRetry(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if hits.Add(1) == 1 {
			w.Header().Set("Content-Length", "100")
			w.WriteHeader(503)
			return
		}
		w.Header().Set("Content-Length", "100")
	}))
	defer srv.Close()
	client := &http.Client{Transport: &Transport{Policy: Policy{BaseDelay: time.Millisecond, Timeout: 5 * time.Second}}}
	resp, err := client.Head(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || hits.Load() != 2 {
		t.Errorf("got %d after %d hits; want 200 after 2", resp.StatusCode, hits.Load())
	}
}
