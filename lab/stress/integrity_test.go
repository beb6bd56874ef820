package stress

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
)

// closeCounter counts the request bodies handed out and closed.
type closeCounter struct{ made, closed atomic.Int64 }

type countedBody struct {
	io.Reader
	c    *closeCounter
	once sync.Once
}

func (b *countedBody) Close() error { b.once.Do(func() { b.c.closed.Add(1) }); return nil }

func (c *closeCounter) body(p []byte) io.ReadCloser {
	c.made.Add(1)
	return &countedBody{Reader: bytes.NewReader(p), c: c}
}

func payload(id, size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(id), uint64(size)))
	for i := range b {
		b[i] = byte('a' + r.IntN(26))
	}
	return b
}

func digest(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:8]) }

// Requests and responses arrive whole, and every request body is closed,
// through an http.Client over a Transport with everything on at once
// (hedging, Timeout, AttemptTimeout per request, callers' deadlines), over
// HTTP/1.1 and HTTP/2 with TLS, against a server that mixes cut 503 bodies,
// 502s, 429s with Retry-After: 0, slow answers and large streamed bodies;
// each POST carries one Idempotency-Key over all its attempts.
func TestIntegrityUnderMixedFaults(t *testing.T) {
	for _, h2 := range []bool{false, true} {
		t.Run(fmt.Sprint("h2=", h2), func(t *testing.T) { stressIntegrity(t, h2) })
	}
}

func stressIntegrity(t *testing.T, h2 bool) {
	var keysMu sync.Mutex
	keys := map[string]map[string]bool{} // request id -> keys seen
	var bodyErrs atomic.Int64
	var hits atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get("X-Id")
		if r.Method == "POST" || r.Method == "PUT" {
			b, err := io.ReadAll(r.Body)
			if err == nil && r.Header.Get("X-Sum") != digest(b) {
				bodyErrs.Add(1)
				t.Errorf("server got a corrupt body for %s %s (%d bytes)", r.Method, id, len(b))
			}
			if err != nil {
				return
			}
			if r.Method == "POST" {
				keysMu.Lock()
				if keys[id] == nil {
					keys[id] = map[string]bool{}
				}
				keys[id][r.Header.Get("Idempotency-Key")] = true
				keysMu.Unlock()
			}
		}
		k := hits.Add(1)
		switch k % 7 {
		case 0:
			w.Header().Set("Content-Length", "100000")
			w.WriteHeader(503)
			w.Write(bytes.Repeat([]byte("x"), 1000)) // short: cut
			return
		case 1:
			w.WriteHeader(502)
			w.Write(bytes.Repeat([]byte("y"), 5000))
			return
		case 2:
			time.Sleep(time.Duration(rand.IntN(8)) * time.Millisecond)
		case 3:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(429)
			return
		}
		size, _ := strconv.Atoi(r.Header.Get("X-Size"))
		n, _ := strconv.Atoi(id)
		out := payload(n, size)
		w.Header().Set("X-Sum", digest(out))
		if r.Method == "HEAD" {
			return
		}
		// write slowly in pieces
		for len(out) > 0 {
			m := min(len(out), 16<<10)
			w.Write(out[:m])
			out = out[m:]
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
		}
	}))
	srv.EnableHTTP2 = h2
	srv.StartTLS()
	defer srv.Close()
	base := srv.Client().Transport.(*http.Transport)
	defer base.CloseIdleConnections()

	var cc closeCounter
	var id atomic.Int64
	tr := &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{BaseDelay: time.Millisecond, ThrottleBaseDelay: time.Millisecond, MaxDelay: 3 * time.Millisecond,
		MaxAttempts: 5, HedgeDelay: 4 * time.Millisecond, HedgeRatio: 0.5, Timeout: 10 * time.Second},
		Budget: retryhttp.NewTokenBucket(1 << 30), OnAttempt: func(retryhttp.Attempt) {}}
	client := &http.Client{Transport: tr}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			for j := 0; j < 40; j++ {
				i := int(id.Add(1))
				method := []string{"GET", "POST", "PUT", "HEAD"}[r.IntN(4)]
				size := []int{0, 10, 70000, 300000}[r.IntN(4)]
				var req *http.Request
				if method == "POST" || method == "PUT" {
					p := payload(-i, r.IntN(200000))
					req, _ = http.NewRequest(method, srv.URL, nil)
					req.Body = cc.body(p)
					req.GetBody = func() (io.ReadCloser, error) { return cc.body(p), nil }
					req.ContentLength = int64(len(p))
					req.Header.Set("X-Sum", digest(p))
				} else {
					req, _ = http.NewRequest(method, srv.URL, nil)
				}
				req.Header.Set("X-Id", strconv.Itoa(i))
				req.Header.Set("X-Size", strconv.Itoa(size))
				ov := retryhttp.Override{}
				if r.IntN(3) == 0 {
					ov.AttemptTimeout = time.Duration(1+r.IntN(20)) * time.Millisecond
				}
				ctx := retryhttp.WithOverride(context.Background(), ov)
				var cancel context.CancelFunc = func() {}
				if r.IntN(5) == 0 {
					ctx, cancel = context.WithTimeout(ctx, time.Duration(r.IntN(30))*time.Millisecond)
				}
				var rep retryhttp.Report
				req = req.WithContext(retryhttp.WithReport(ctx, &rep))
				resp, err := client.Do(req)
				if err != nil {
					cancel()
					continue
				}
				b, rerr := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				if rerr != nil {
					if ctx.Err() == nil && resp.StatusCode != 503 {
						t.Errorf("%s %d: body read failed with live ctx: %v (status %d, decision %v, attempts %d)", method, i, rerr, resp.StatusCode, rep.Decision, len(rep.History))
					}
					continue
				}
				if resp.StatusCode == 200 && method != "HEAD" && resp.Header.Get("X-Sum") != digest(b) {
					t.Errorf("%s %d: corrupt response body (%d bytes)", method, i, len(b))
				}
			}
		}(g)
	}
	wg.Wait()
	deadline := time.Now().Add(2 * time.Second)
	for cc.made.Load() != cc.closed.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if cc.made.Load() != cc.closed.Load() {
		t.Errorf("request bodies: %d made, %d closed", cc.made.Load(), cc.closed.Load())
	}
	keysMu.Lock()
	for id, ks := range keys {
		if len(ks) != 1 {
			t.Errorf("request %s: %d keys %v", id, len(ks), ks)
		}
	}
	keysMu.Unlock()
}
