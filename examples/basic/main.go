// Command basic shows retryhttp doing its main job against a local server
// that fails in the ways real dependencies do. It needs no network:
//
//	go run ./examples/basic
package main

import (
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"time"

	"github.com/herdproof/retryhttp"
)

func main() {
	srv := newServer()
	defer srv.Close()

	tr := &retryhttp.Transport{OnAttempt: printAttempt, Budget: tokens}
	client := &http.Client{Transport: tr}

	section("1. A blip: 503 twice, then 200. Full-jitter waits: the first in [0, 50ms], the second in [0, 100ms].")
	show(client.Get(srv.URL + "/blip"))

	section("2. Throttled: 429 with Retry-After: 1. The server's delay wins (1s to 1.1s).")
	show(client.Get(srv.URL + "/throttled"))

	section("3. A charge whose response is lost after the server committed it.")
	// A Transport of its own, so the charge goes out on a new connection:
	// on a reused one, net/http itself replays a request that carries an
	// Idempotency-Key, out of our sight (see docs/design.md).
	writer := &http.Client{Transport: &retryhttp.Transport{OnAttempt: printAttempt, Budget: tokens}}
	show(writer.Post(srv.URL+"/charges", "application/json", strings.NewReader(`{"amount":100}`)))
	fmt.Printf("   the server saw %d attempts and performed %d charge: one key on every attempt\n",
		srv.attempts("/charges"), srv.charges())

	section("4. 404 is not retried: it will not go away.")
	show(client.Get(srv.URL + "/missing"))

	section("5. An outage: 100 requests to a server that is down, default budget.")
	budget := retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens) // what a nil Budget means
	quiet := &retryhttp.Transport{Policy: retryhttp.Policy{BaseDelay: time.Millisecond}, Budget: budget}
	before := srv.attempts("/down")
	for range 100 {
		resp, err := (&http.Client{Transport: quiet}).Get(srv.URL + "/down")
		if err == nil {
			resp.Body.Close()
		}
	}
	got := srv.attempts("/down") - before
	fmt.Printf("   attempts sent: %d for 100 requests (3 attempts each would be 300)\n", got)
	fmt.Printf("   budget left: %d of %d tokens; once it is spent, a request costs one attempt\n",
		budget.Available(), retryhttp.DefaultBudgetTokens)
}

// tokens is the budget of the clients whose attempts printAttempt shows,
// shared by them: what a nil Budget means, one for both.
var tokens = retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens)

func printAttempt(a retryhttp.Attempt) {
	outcome := fmt.Sprint(a.Status)
	if a.Err != nil {
		outcome = "network error"
	}
	line := fmt.Sprintf("   attempt %d: %-13s %-10v -> %v", a.Number, outcome, a.Class, a.Decision)
	if a.Decision == retryhttp.Retry {
		source := "backoff"
		if a.ServerDelay {
			source = "server"
		}
		line += fmt.Sprintf(" in %v (%v)", a.Delay.Round(time.Millisecond), source)
	}
	if key := a.Request.Header.Get("Idempotency-Key"); key != "" {
		line += " key " + key[:8] + "…"
	}
	fmt.Printf("%s, tokens %d\n", line, tokens.Available())
}

func section(s string) { fmt.Println("\n" + s) }

func show(resp *http.Response, err error) {
	if err != nil {
		fmt.Println("   =>", err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Printf("   => %d %s\n", resp.StatusCode, strings.TrimSpace(string(body)))
}

// server fails each path in its own way and counts what it sees.
type server struct {
	*httptest.Server
	mu    sync.Mutex
	seen  map[string]int
	keys  map[string]bool
	total int
}

func newServer() *server {
	s := &server{seen: map[string]int{}, keys: map[string]bool{}}
	s.Server = httptest.NewServer(http.HandlerFunc(s.handle))
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	return s
}

func (s *server) attempts(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seen[path]
}

func (s *server) charges() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

func (s *server) handle(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.seen[r.URL.Path]++
	n := s.seen[r.URL.Path]
	s.mu.Unlock()
	switch r.URL.Path {
	case "/blip":
		if n <= 2 {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	case "/throttled":
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "slow down", http.StatusTooManyRequests)
			return
		}
		fmt.Fprintln(w, "ok")
	case "/charges":
		key := r.Header.Get("Idempotency-Key")
		s.mu.Lock()
		if !s.keys[key] { // a deduplicating API: one charge per key
			s.keys[key] = true
			s.total++
		}
		s.mu.Unlock()
		if n == 1 { // committed, then the connection drops
			conn, _, _ := http.NewResponseController(w).Hijack()
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close()
			return
		}
		fmt.Fprintln(w, "charged")
	case "/down":
		http.Error(w, "down", http.StatusServiceUnavailable)
	default:
		http.NotFound(w, r)
	}
}
