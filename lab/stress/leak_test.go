package stress

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	rht "github.com/herdproof/retryhttp/retryhttptest"
	"go.uber.org/goleak"
)

// Each test checks with goleak.VerifyNone, deferred right after its server
// starts (whose own goroutines it ignores), so that it runs after the test
// has closed its idle connections but before t.Cleanup closes the server: a
// closed server would end the goroutines of a leaked connection and hide it. TestMain checks once more after everything: no
// retry wait, attempt timer, body watcher or connection may outlive its
// request.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func get(t *testing.T, ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

func TestNoLeakAfterCancelMidWait(t *testing.T) {
	srv := rht.NewServer(t, rht.Status(429))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the server's own goroutines are not leaks
	// Always the top of the window: a 1s wait after the 429, cancelled at
	// 20ms. (With a deadline instead, the Transport would not start a wait
	// that cannot end in time, and would return the 429.)
	tr := &retryhttp.Transport{Policy: retryhttp.Policy{Rand: func(n int64) int64 { return n - 1 }}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			timer := time.AfterFunc(20*time.Millisecond, cancel)
			defer timer.Stop()
			start := time.Now()
			resp, err := get(t, ctx, client, srv.URL)
			took := time.Since(start)
			switch {
			case err == nil:
				// Cancelled while the 429 was on its way: its headers had
				// arrived, so it is the answer.
				resp.Body.Close()
			case !errors.Is(err, context.Canceled):
				t.Errorf("got %v; want context.Canceled or the 429", err)
			}
			if took > 500*time.Millisecond {
				t.Errorf("returned after %v; want soon after the 20ms cancel", took)
			}
		})
	}
	wg.Wait()
}

func TestNoLeakAfterAttemptTimeouts(t *testing.T) {
	srv := rht.NewServer(t, rht.Hang().Times(100), rht.Status(200))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the server's own goroutines are not leaks
	tr := &retryhttp.Transport{Policy: retryhttp.Policy{
		AttemptTimeout: 20 * time.Millisecond, Timeout: 2 * time.Second, MaxAttempts: 5, BaseDelay: time.Millisecond,
	}, Budget: retryhttp.NewTokenBucket(math.MaxInt)}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			resp, err := get(t, context.Background(), client, srv.URL)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

func TestNoLeakWhenBodyLeftUnread(t *testing.T) {
	// A response read halfway and closed, with both timeouts set: the
	// context watchers must go when the body is closed.
	srv := rht.NewServer(t, rht.Status(503).WithBody(strings.Repeat("busy ", 1000)), rht.Status(200).WithBody(string(make([]byte, 1<<20))))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the server's own goroutines are not leaks
	tr := &retryhttp.Transport{Policy: retryhttp.Policy{
		AttemptTimeout: time.Second, Timeout: 10 * time.Second, BaseDelay: time.Millisecond,
	}}
	defer tr.CloseIdleConnections()
	resp, err := get(t, context.Background(), &http.Client{Transport: tr}, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	io.CopyN(io.Discard, resp.Body, 1000)
	resp.Body.Close()
}

func TestNoLeakOverHTTP2(t *testing.T) {
	srv := rht.NewUnstartedServer(t, rht.CommitThenDrop(), rht.Status(503).WithBody(strings.Repeat("busy ", 1000)), rht.Status(200))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the server's own goroutines are not leaks
	base := srv.Client().Transport
	tr := &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{BaseDelay: time.Millisecond}}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("POST", srv.URL, nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	rht.AssertAttempts(t, srv, 3)
	rht.AssertStableKey(t, srv)
}

func TestNoLeakOnDialFailures(t *testing.T) {
	defer goleak.VerifyNone(t)
	tr := &retryhttp.Transport{Policy: retryhttp.Policy{BaseDelay: time.Millisecond}}
	defer tr.CloseIdleConnections()
	_, err := get(t, context.Background(), &http.Client{Transport: tr}, "http://127.0.0.1:1/")
	var re *retryhttp.Error
	if !errors.As(err, &re) || re.Attempts != 3 {
		t.Errorf("got %v; want an *Error after 3 attempts", err)
	}
}

func TestNoLeakOnRetriedResponses(t *testing.T) {
	// Discarded 503s with bodies, and no timeout whose cancellation would
	// tear their connections down anyway: only draining and closing them
	// frees their connections.
	busy := rht.Status(503).WithBody(strings.Repeat("busy ", 1000))
	srv := rht.NewServer(t, busy, busy, rht.Status(200), busy, rht.Status(200))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the server's own goroutines are not leaks
	tr := &retryhttp.Transport{Policy: retryhttp.Policy{BaseDelay: time.Millisecond}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for range 2 {
		resp, err := get(t, context.Background(), client, srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	rht.AssertAttempts(t, srv, 5)
	if got := srv.Conns(); got != 1 {
		t.Errorf("got %d connections; want 1 (each discarded body drained and closed)", got)
	}
}

// Hedged requests over HTTP/1.1 and HTTP/2: every losing copy is canceled,
// its response drained and closed, and nothing outlives the request; over
// HTTP/2 all copies share one connection.
func TestNoLeakWhenHedging(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		name := "HTTP/1.1"
		if h2 {
			name = "HTTP/2"
		}
		t.Run(name, func(t *testing.T) {
			// Every other answer is slow: each request's first copy is slow
			// and its hedge fast. A first request, not hedged, makes the
			// connection: a hedge sent while the first TLS handshake is
			// still under way would dial a second one (net/http does not
			// wait for a handshake in progress to learn it speaks HTTP/2).
			steps := []rht.Step{rht.Status(200)}
			for range 5 {
				steps = append(steps, rht.Status(200).WithDelay(300*time.Millisecond).WithBody(strings.Repeat("x", 1000)), rht.Status(200).WithBody("fast"))
			}
			srv := rht.NewUnstartedServer(t, steps...)
			var base *http.Transport
			if h2 {
				srv.EnableHTTP2 = true
				srv.StartTLS()
				base = srv.Client().Transport.(*http.Transport)
			} else {
				srv.Start()
				base = &http.Transport{}
			}
			tr := &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{HedgeDelay: 20 * time.Millisecond, HedgeRatio: 1}}
			defer verifyNoneOnceIdle(t, tr, goleak.IgnoreCurrent())
			warm, err := get(t, context.Background(), &http.Client{Transport: base}, srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			warm.Body.Close()
			client := &http.Client{Transport: tr}
			for range 5 {
				resp, err := get(t, context.Background(), client, srv.URL)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if string(b) != "fast" {
					t.Errorf("got %q; want the hedge's fast answer", b)
				}
			}
			if h2 && srv.Conns() != 1 {
				t.Errorf("HTTP/2: got %d connections; want 1 (canceled streams, not connections)", srv.Conns())
			}
		})
	}
}

// verifyNoneOnceIdle closes tr's idle connections and then checks for leaked
// goroutines, as the deferred pair in the other tests does, for tests whose
// last request canceled an HTTP/2 stream. net/http forgets a canceled stream
// in the stream's own writer goroutine, a moment after RoundTrip has returned
// (h2_bundle.go, cleanupWriteRequest), and until then the connection is not
// idle and CloseIdleConnections leaves it open. So it closes idle
// connections again until no goroutine is left, for about 3 s: a connection
// still busy after that, like any goroutine of the Transport, is a leak.
func verifyNoneOnceIdle(t *testing.T, tr *retryhttp.Transport, opts ...goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Second) // plus one last Find
	for {
		tr.CloseIdleConnections()
		err := goleak.Find(opts...) // itself retries for about a second
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Error(err)
			return
		}
	}
}

// Requests waiting for a RateLimiter's permits: some get one, some fail at
// once (no permit before their deadline), some are canceled while they
// wait. None leaves a timer or a goroutine behind.
func TestNoLeakWithLimiter(t *testing.T) {
	srv := rht.NewServer(t, rht.Status(429), rht.Status(200).Times(100))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the server's own goroutines are not leaks
	tr := &retryhttp.Transport{Limiter: &retryhttp.RateLimiter{}, Policy: retryhttp.Policy{MaxAttempts: 1}}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	resp, err := get(t, context.Background(), client, srv.URL) // the 429: limiting from now on
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var (
		wg                      sync.WaitGroup
		mu                      sync.Mutex
		sent, limited, canceled int
	)
	// The first three take the first permits (400 ms apart at the first
	// cut's 2.5/s) and are canceled at 50 ms while they wait, giving their
	// slots back; of the others, those whose permit comes within a tenth
	// of their 20 s deadline are sent, the rest fail at once.
	for i := range 30 {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		if i < 3 {
			time.AfterFunc(50*time.Millisecond, cancel)
		}
		wg.Go(func() {
			defer cancel()
			resp, err := get(t, ctx, client, srv.URL)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				resp.Body.Close()
				sent++
			case errors.Is(err, retryhttp.ErrRateLimited):
				limited++
			case errors.Is(err, context.Canceled):
				canceled++
			default:
				t.Errorf("got %v; want a response, ErrRateLimited or context.Canceled", err)
			}
		})
		if i < 3 {
			time.Sleep(20 * time.Millisecond) // its permit is taken before the next request's
		}
	}
	wg.Wait()
	if sent == 0 || limited == 0 || canceled != 3 {
		t.Errorf("got %d sent, %d rate limited, %d canceled; want some sent, some limited, 3 canceled", sent, limited, canceled)
	}
}

func TestNoLeakWithPerHost(t *testing.T) {
	// Three destinations over real sockets (one down, one throttling, one
	// slow now and then, hedged), each with a budget and a limiter of its
	// own, MaxHosts 2 so that destinations are forgotten and made again
	// while requests run: nothing outlives its request.
	down := rht.NewServer(t, rht.Status(503))
	throttling := rht.NewServer(t, rht.Status(429))
	slow := rht.NewServer(t, rht.Status(200).WithDelay(30*time.Millisecond).Times(1), rht.Status(200).Times(3))
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent()) // the servers' own goroutines are not leaks
	tr := &retryhttp.Transport{
		PerHost: &retryhttp.PerHost{MaxHosts: 2, IdleTimeout: time.Millisecond,
			Limiter: func(string) *retryhttp.RateLimiter { return &retryhttp.RateLimiter{} }},
		Policy: retryhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond,
			HedgeDelay: 10 * time.Millisecond, HedgeRatio: 1},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Go(func() {
			for i := range 10 {
				url := []string{down.URL, throttling.URL, slow.URL}[(g+i)%3]
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				resp, err := get(t, ctx, client, url)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				cancel()
			}
		})
	}
	wg.Wait()
	// The bound on destinations tracked is checked inside the library
	// (hosts_test.go): PerHost no longer exports a count.
}
