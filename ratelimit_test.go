package retryhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp"
)

// The RateLimiter through its exported API only: a Transport over a
// scripted server, in fake time, and RateLimiter.Stats.

// server is a base RoundTripper whose answers a test scripts: answer decides
// each attempt's status (and headers) from its number, counted from 1. It
// records when each attempt came.
type server struct {
	mu     sync.Mutex
	answer func(n int, at time.Time) (int, http.Header)
	sent   []time.Time
}

func (s *server) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	now := time.Now()
	s.sent = append(s.sent, now)
	n := len(s.sent)
	code, h := http.StatusOK, http.Header{}
	if s.answer != nil {
		code, h = s.answer(n, now)
	}
	s.mu.Unlock()
	if h == nil {
		h = http.Header{}
	}
	return &http.Response{StatusCode: code, Status: http.StatusText(code), Header: h,
		Body: io.NopCloser(strings.NewReader("")), Request: req}, nil
}

// times reports when each attempt reached the server.
func (s *server) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.sent...)
}

// throttleFirst is a server that answers its first attempt 429, and 200
// after.
func throttleFirst() *server {
	return &server{answer: func(n int, _ time.Time) (int, http.Header) {
		if n == 1 {
			return http.StatusTooManyRequests, nil
		}
		return http.StatusOK, nil
	}}
}

// get sends one GET through tr with ctx and reports its status, or its
// error.
func get(tr http.RoundTripper, ctx context.Context) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.test/", nil)
	if err != nil {
		return 0, err
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// getWithin is get with a deadline d from now.
func getWithin(tr http.RoundTripper, d time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return get(tr, ctx)
}

// limited returns a Transport with one attempt a request over srv, and its
// limiter after one throttle.
func limited(t *testing.T, srv *server) (*retryhttp.Transport, *retryhttp.RateLimiter) {
	t.Helper()
	lim := &retryhttp.RateLimiter{}
	tr := &retryhttp.Transport{Base: srv, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
	if code, err := get(tr, context.Background()); code != http.StatusTooManyRequests {
		t.Fatalf("got (%d, %v); want the 429", code, err)
	}
	if r := lim.Stats().Rate; r <= 0 {
		t.Fatalf("got a rate of %v after a 429; want a limit", r)
	}
	return tr, lim
}

// Refused callers do not refuse the next: a caller the limiter refuses
// sends nothing, and neither shortens the queue a later caller may wait in
// nor moves its permit. 30 callers whose 10 ms deadlines their permits would
// miss are refused; a lone caller with a 2 s deadline (its share of it,
// 200 ms, is past its permit, 143 ms away) then gets the permit it would
// have got without them.
func TestRefusedCallersDoNotRefuseTheNext(t *testing.T) {
	sentAfter := func(t *testing.T, refused int) time.Duration {
		var got time.Duration
		synctest.Test(t, func(t *testing.T) {
			srv := throttleFirst()
			tr, lim := limited(t, srv)
			start := time.Now()
			for range refused {
				if _, err := getWithin(tr, 10*time.Millisecond); !errors.Is(err, retryhttp.ErrRateLimited) {
					t.Fatalf("a caller with a 10 ms deadline: got %v; want ErrRateLimited", err)
				}
			}
			if got := lim.Stats().Refused; got != int64(refused) {
				t.Errorf("got %d refused; want %d", got, refused)
			}
			if code, err := getWithin(tr, 2*time.Second); code != http.StatusOK {
				t.Fatalf("the lone caller with a 2 s deadline: got (%d, %v); want 200", code, err)
			}
			sent := srv.times()
			got = sent[len(sent)-1].Sub(start)
		})
		return got
	}
	want := sentAfter(t, 0)
	if got := sentAfter(t, 30); got != want {
		t.Errorf("after 30 refused callers, the lone caller was sent after %v; want %v, as without them", got, want)
	}
}

// A waiter whose context ends gives its slot back, in whatever order the
// waiters give up: six callers queue for permits and all cancel; the next
// caller is sent when the first of them would have been.
func TestCanceledWaitersGiveBackTheirSlots(t *testing.T) {
	orders := []struct {
		name  string
		order []int
	}{
		{"newest first", []int{5, 4, 3, 2, 1, 0}},
		{"oldest first", []int{0, 1, 2, 3, 4, 5}},
		{"interleaved", []int{0, 2, 4, 1, 3, 5}},
		{"middle out", []int{2, 3, 1, 4, 0, 5}},
	}
	for _, o := range orders {
		t.Run(o.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				srv := throttleFirst()
				tr, lim := limited(t, srv)
				start := time.Now()
				first := time.Duration(float64(time.Second) / lim.Stats().Rate)
				var cancels []context.CancelFunc
				var wg sync.WaitGroup
				for range 6 {
					ctx, cancel := context.WithCancel(context.Background())
					cancels = append(cancels, cancel)
					wg.Go(func() {
						if _, err := get(tr, ctx); !errors.Is(err, context.Canceled) {
							t.Errorf("a canceled waiter: got %v; want context.Canceled", err)
						}
					})
					synctest.Wait() // queued in this order
				}
				for _, i := range o.order {
					cancels[i]()
					synctest.Wait()
				}
				wg.Wait()
				if code, err := getWithin(tr, 10*time.Second); code != http.StatusOK {
					t.Fatalf("got (%d, %v); want 200", code, err)
				}
				sent := srv.times()
				if len(sent) != 2 {
					t.Fatalf("got %d attempts; want 2 (the 429, then the last caller's)", len(sent))
				}
				if got := sent[1].Sub(start); got > first {
					t.Errorf("the caller after six canceled waiters was sent after %v; want at most %v, the first waiter's slot", got, first)
				}
			})
		})
	}
}
