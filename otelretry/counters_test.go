package otelretry

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp"
	"go.opentelemetry.io/otel/attribute"
)

type randomBase struct {
	mu  sync.Mutex
	rng *rand.Rand
}

func (b *randomBase) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	b.mu.Lock()
	k := b.rng.IntN(7)
	delay := time.Duration(b.rng.IntN(4)) * 40 * time.Millisecond
	b.mu.Unlock()
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-r.Context().Done():
			t.Stop()
			return nil, r.Context().Err()
		case <-t.C:
		}
	}
	mk := func(code int, h ...string) *http.Response {
		hd := http.Header{}
		for i := 0; i+1 < len(h); i += 2 {
			hd.Set(h[i], h[i+1])
		}
		return &http.Response{StatusCode: code, Header: hd, Body: io.NopCloser(strings.NewReader("x")), Request: r}
	}
	switch k {
	case 0, 1:
		return mk(200), nil
	case 2:
		return mk(503), nil
	case 3:
		return mk(503, "Retry-After", "1"), nil
	case 4:
		return mk(429, "Retry-After", "2"), nil
	case 5:
		return nil, syscall.ECONNRESET
	default:
		return mk(404), nil
	}
}

// Across many mixed requests, giveups, retries and requests agree with how
// each request ended.
func TestCountersMatchRoundTrips(t *testing.T) {
	for seed := uint64(0); seed < 60; seed++ {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, 1))
				m, reader := newMetrics(t)
				p := retryhttp.Policy{Rand: func(int64) int64 { return 0 }}
				if rng.IntN(2) == 0 {
					p.HedgeDelay, p.HedgeRatio = 50*time.Millisecond, 1
				}
				if rng.IntN(3) == 0 {
					p.Timeout = 2 * time.Second
				}
				var lim *retryhttp.RateLimiter
				if rng.IntN(2) == 0 {
					lim = &retryhttp.RateLimiter{MaxWait: 300 * time.Millisecond}
				}
				var nAtt int
				wantGiveups := map[string]int64{}
				var wantRetries, wantRequests int64
				tr := &retryhttp.Transport{Base: &randomBase{rng: rand.New(rand.NewPCG(seed, 2))}, Policy: p, Limiter: lim,
					OnAttempt: func(a retryhttp.Attempt) { nAtt++ },
					OnEnd: func(_ *http.Request, e retryhttp.Report) {
						if nAtt > 0 {
							wantRequests++
							wantRetries += int64(nAtt - 1)
						}
						if e.Decision != retryhttp.Done && e.Attempts > 0 {
							wantGiveups[e.Decision.String()]++
						}
					}}
				m.Instrument(tr)
				for i := 0; i < 30; i++ {
					nAtt = 0
					// A deadline ends no wait (a wait that would pass it is
					// not begun); a cancellation may.
					after := time.Duration(rng.IntN(4000)) * time.Millisecond
					ctx, cancel := context.WithTimeout(context.Background(), after)
					if rng.IntN(2) == 0 {
						cancel()
						ctx, cancel = context.WithCancel(context.Background())
						time.AfterFunc(after, cancel)
					}
					req, _ := http.NewRequestWithContext(ctx, "GET", "http://orders.test/", nil)
					resp, err := tr.RoundTrip(req)
					if err == nil {
						resp.Body.Close()
					}
					cancel()
				}
				got := collect(t, reader)
				var all int64
				for reason, n := range wantGiveups {
					all += n
					if g := sum(t, got["retryhttp.giveups"], attribute.String("http.request.method", "GET"), attribute.String("retryhttp.reason", reason)); g != n {
						t.Errorf("giveups, %s: got %d; want %d", reason, g, n)
					}
				}
				total := func(name string) int64 { // 0 when nothing was recorded
					if r, ok := got[name]; ok && r.Data != nil {
						return sum(t, r)
					}
					return 0
				}
				if g := total("retryhttp.giveups"); g != all {
					t.Errorf("giveups: got %d; want %d", g, all)
				}
				if g := total("retryhttp.retries"); g != wantRetries {
					t.Errorf("retries: got %d; want %d", g, wantRetries)
				}
				if g := total("retryhttp.requests"); g != wantRequests {
					t.Errorf("requests: got %d; want %d", g, wantRequests)
				}
			})
		})
	}
}
