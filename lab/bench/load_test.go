package bench

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// report collects markdown rows; run.sh sets BENCH_REPORT to a file, and
// each test appends its table there.
func report(t *testing.T, lines ...string) {
	t.Helper()
	for _, l := range lines {
		t.Log(l)
	}
	path := os.Getenv("BENCH_REPORT")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintln(f, strings.Join(lines, "\n")+"\n")
}

// switchable answers 503 while down, 200 otherwise, and counts attempts.
type switchable struct {
	down     atomic.Bool
	attempts atomic.Int64
}

func (s *switchable) RoundTrip(req *http.Request) (*http.Response, error) {
	s.attempts.Add(1)
	code := 200
	if s.down.Load() {
		code = 503
	}
	c := &canned{}
	c.resp = http.Response{StatusCode: code, Header: http.Header{}, Body: &c.body, Request: req}
	return &c.resp, nil
}

// Workload 5: a sustained outage, each library in its default
// configuration, in fake time (testing/synctest) so that real default waits
// cost nothing. Attempts per request during the outage, then after the
// service heals (500 successes), then in a second outage.
func TestOutageAmplification(t *testing.T) {
	const requests = 10_000
	rows := []string{
		"| library | attempts per request in the outage (10,000 requests) | after healing (500 successes): attempts for the next failing request | and per request over the next 100 failing ones |",
		"|---|---|---|---|",
	}
	for _, impl := range Impls[1:] {
		synctest.Test(t, func(t *testing.T) {
			s := &switchable{}
			rt := impl.New(s, false)
			run := func(n int) float64 {
				before := s.attempts.Load()
				req, _ := http.NewRequest("GET", "http://bench.test/", nil)
				for range n {
					if resp, err := rt.RoundTrip(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				}
				return float64(s.attempts.Load()-before) / float64(n)
			}
			s.down.Store(true)
			outage := run(requests)
			s.down.Store(false)
			run(500)
			s.down.Store(true)
			first := run(1)
			again := run(100)
			rows = append(rows, fmt.Sprintf("| %s | %.3f | %.0f | %.2f |", impl.Name, outage, first, again))
			if impl.Name == "retryhttp" {
				if outage > 1.05 {
					t.Errorf("retryhttp: got %.3f attempts per request in the outage; want at most 1.05", outage)
				}
				if first != 3 {
					t.Errorf("retryhttp: got %.0f attempts for the first failure after healing; want 3 (full retries back)", first)
				}
			}
		})
	}
	report(t, rows...)
}

// Workload 6: 50 requests that each get a 503 then a 200, over loopback:
// how many TCP connections each library opens, and how many goroutines it
// leaves behind once the idle connections are closed.
func TestConnections(t *testing.T) {
	rows := []string{
		"| library | TCP connections for 50 requests (100 attempts) | goroutines left behind |",
		"|---|---|---|",
	}
	for _, impl := range Impls {
		var conns, n atomic.Int64
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if n.Add(1)%2 == 1 {
				w.WriteHeader(503)
				io.WriteString(w, strings.Repeat("service unavailable ", 50)) // a 1 KB error page
				return
			}
			io.WriteString(w, "ok")
		}))
		srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
			if st == http.StateNew {
				conns.Add(1)
			}
		}
		srv.Start()
		before := settledGoroutines()
		base := &http.Transport{}
		rt := impl.New(base, true)
		for range 50 {
			req, _ := http.NewRequest("GET", srv.URL, nil)
			if impl.Name == "base" { // the floor: a 503 read and closed by hand, then the 200
				resp, err := rt.RoundTrip(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
			resp, err := rt.RoundTrip(req)
			if err != nil {
				t.Fatalf("%s: %v", impl.Name, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Fatalf("%s: got %d; want 200", impl.Name, resp.StatusCode)
			}
		}
		base.CloseIdleConnections()
		left := settledGoroutines() - before
		srv.CloseClientConnections()
		srv.Close()
		rows = append(rows, fmt.Sprintf("| %s | %d | %d |", impl.Name, conns.Load(), left))
		if impl.Name == "retryhttp" && (conns.Load() != 1 || left > 0) {
			t.Errorf("retryhttp: got %d connections and %d goroutines left; want 1 and 0", conns.Load(), left)
		}
	}
	report(t, rows...)
}

// settledGoroutines waits for the goroutine count to stop changing (closed
// connections take a moment to end theirs) and returns it.
func settledGoroutines() int {
	n, stable := runtime.NumGoroutine(), 0
	for stable < 5 {
		time.Sleep(20 * time.Millisecond)
		if m := runtime.NumGoroutine(); m == n {
			stable++
		} else {
			n, stable = m, 0
		}
	}
	return n
}
