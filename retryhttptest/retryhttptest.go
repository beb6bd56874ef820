// Package retryhttptest provides scripted, failing HTTP endpoints for testing
// code that retries: a Server (a real httptest.Server on loopback) and a
// Transport (an in-memory http.RoundTripper). Both answer from a script of
// Steps, such as "503 twice, then 200", and record every attempt they
// receive: its time, method, path, headers, body and idempotency key.
//
//	srv := retryhttptest.NewServer(t, retryhttptest.Status(503).Times(2), retryhttptest.Status(200))
//	// ... exercise the client against srv.URL ...
//	retryhttptest.AssertAttempts(t, srv, 3)
//	retryhttptest.AssertStableKey(t, srv)
//
// The Transport takes its time from time.Now, so inside a testing/synctest
// bubble it records fake time and its Hang and Delay steps cost no real time:
// backoff tests run in microseconds with exact assertions. The Server uses
// real connections and real time: give the client under test millisecond
// delays.
//
// Both perform the effect of each POST and PATCH once per idempotency key,
// as a deduplicating API does, and count those effects: a test can prove
// that a write retried after a lost response happened exactly once.
//
// usage_test.go in this package holds two complete tests to copy: one
// against a Server, one with a Transport in a synctest bubble.
package retryhttptest

import (
	"net/http"
	"strconv"
	"sync"
	"time"
)

// KeyHeader is the header whose value Attempt.Key records and by which
// effects are deduplicated, unless a Server's or Transport's KeyHeader field
// names another (for a client whose Policy.IdempotencyHeader is not the
// default).
const KeyHeader = "Idempotency-Key"

// A Step is one scripted answer. The last step of a script repeats for
// every attempt beyond the script's end; an empty script answers 200.
type Step struct {
	// Code is the response status; zero means 200.
	Code int
	// Header is added to the response.
	Header http.Header
	// Body is the response body.
	Body string
	// Delay is how long to wait before answering (or before Hang, Reset
	// or CommitThenDrop take effect).
	Delay time.Duration
	// Err, on a Transport, fails the attempt with this error instead of a
	// response. A Server cannot send a Go error: NewServer and
	// NewUnstartedServer fail the test if a step sets it (use Reset or
	// CommitThenDrop).
	Err error
	// Hang never answers: the attempt ends when the request's context does
	// (or, on a Server, when the Server closes).
	Hang bool
	// Reset cuts the connection before any response. A Server sends a TCP
	// reset; a Transport returns an error wrapping syscall.ECONNRESET. No
	// effect is performed.
	Reset bool
	// CommitThenDrop performs the request's effect, then cuts the
	// connection without a response, as a server that crashed after
	// committing would.
	CommitThenDrop bool

	times    int
	timesSet bool
}

// Status returns a step that answers with the given status code.
func Status(code int) Step { return Step{Code: code} }

// RetryAfter returns a step that answers code with a Retry-After header
// (seconds or an HTTP-date).
func RetryAfter(code int, value string) Step {
	return Step{Code: code, Header: http.Header{"Retry-After": {value}}}
}

// Hang returns a step that never answers.
func Hang() Step { return Step{Hang: true} }

// Reset returns a step that cuts the connection before answering.
func Reset() Step { return Step{Reset: true} }

// CommitThenDrop returns a step that performs the effect and then cuts the
// connection.
func CommitThenDrop() Step { return Step{CommitThenDrop: true} }

// Times returns the step repeated n times in the script; zero (or less)
// leaves it out.
func (s Step) Times(n int) Step {
	s.times, s.timesSet = max(n, 0), true
	return s
}

// WithDelay returns the step answering after d.
func (s Step) WithDelay(d time.Duration) Step {
	s.Delay = d
	return s
}

// WithBody returns the step with the given response body.
func (s Step) WithBody(body string) Step {
	s.Body = body
	return s
}

// WithHeader returns the step with a response header added.
func (s Step) WithHeader(name, value string) Step {
	h := s.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	h.Add(name, value)
	s.Header = h
	return s
}

// An Attempt is what a Server or Transport received.
type Attempt struct {
	Time   time.Time
	Method string
	Path   string
	Header http.Header
	Body   string
	// Key is the idempotency key header (KeyHeader, or the KeyHeader field
	// of the Server or Transport), "" if absent.
	Key string
}

// A Recorder is a Server or a Transport: anything that reports the attempts
// it received.
type Recorder interface {
	Attempts() []Attempt
}

// script turns the steps into a lookup by attempt index and keeps the
// record and the effects. It is the state shared by Server and Transport.
type script struct {
	steps     []Step
	keyHeader string

	mu       sync.Mutex
	attempts []Attempt
	effects  map[string]bool // keys whose effect was performed
	nEffects int
}

func newScript(steps []Step, keyHeader string) *script {
	var flat []Step
	for _, s := range steps {
		n := 1
		if s.timesSet {
			n = s.times
		}
		s.times, s.timesSet = 0, false
		for range n {
			flat = append(flat, s)
		}
	}
	if len(flat) == 0 {
		flat = []Step{Status(http.StatusOK)}
	}
	if keyHeader == "" {
		keyHeader = KeyHeader
	}
	return &script{steps: flat, keyHeader: keyHeader, effects: map[string]bool{}}
}

// record stores an attempt and returns the step that answers it.
func (s *script) record(r *http.Request, body []byte) Step {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.attempts = append(s.attempts, Attempt{
		Time: time.Now(), Method: r.Method, Path: r.URL.Path,
		Header: r.Header.Clone(), Body: string(body), Key: r.Header.Get(s.keyHeader),
	})
	return s.steps[min(len(s.attempts), len(s.steps))-1]
}

// effect performs a write's effect once per idempotency key; a write with no
// key is performed every time.
func (s *script) effect(r *http.Request) {
	if r.Method != http.MethodPost && r.Method != http.MethodPatch {
		return
	}
	key := r.Header.Get(s.keyHeader)
	s.mu.Lock()
	defer s.mu.Unlock()
	if key == "" || !s.effects[key] {
		s.effects[key] = true
		s.nEffects++
	}
}

// Attempts returns a copy of the attempts received so far, in order.
func (s *script) Attempts() []Attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Attempt(nil), s.attempts...)
}

// Effects returns how many POST or PATCH effects were performed: one per
// distinct idempotency key, plus one per write that carried none.
func (s *script) Effects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nEffects
}

func code(s Step) int {
	if s.Code == 0 {
		return http.StatusOK
	}
	return s.Code
}

func statusLine(c int) string { return strconv.Itoa(c) + " " + http.StatusText(c) }
