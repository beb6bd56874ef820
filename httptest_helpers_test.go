package retryhttp

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// step scripts one answer of a test base or server. The last step of a
// script repeats forever.
type step struct {
	status int         // response status; 0 with err unset means 200
	header http.Header // response headers
	body   string      // response body
	err    error       // memBase: fail the attempt with this error instead
	block  bool        // memBase: wait for the request's context to end

	// flakyServer only
	reset          bool // close the connection with RST before answering
	commitThenDrop bool // perform the request's effect, then cut the connection
}

func status(code int) step { return step{status: code} }

func retryAfter(code int, name, value string) step {
	return step{status: code, header: http.Header{http.CanonicalHeaderKey(name): {value}}}
}

// record is what a test base or server saw of one attempt.
type record struct {
	At     time.Time
	Method string
	Path   string
	Header http.Header
	Body   string
}

// recorder keeps the attempts seen, in order. Safe for concurrent use.
type recorder struct {
	mu       sync.Mutex
	attempts []record
}

func (r *recorder) add(req *http.Request, body []byte) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = append(r.attempts, record{
		At: time.Now(), Method: req.Method, Path: req.URL.Path,
		Header: req.Header.Clone(), Body: string(body),
	})
	return len(r.attempts) - 1
}

// Attempts returns a copy of the attempts seen so far.
func (r *recorder) Attempts() []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]record(nil), r.attempts...)
}

// Keys returns the idempotency key each attempt carried ("" for none).
func (r *recorder) Keys() []string {
	var keys []string
	for _, a := range r.Attempts() {
		keys = append(keys, a.Header.Get(DefaultIdempotencyHeader))
	}
	return keys
}

// Gaps returns the time between consecutive attempts.
func (r *recorder) Gaps() []time.Duration {
	as := r.Attempts()
	var gaps []time.Duration
	for i := 1; i < len(as); i++ {
		gaps = append(gaps, as[i].At.Sub(as[i-1].At))
	}
	return gaps
}

// memBase is an in-memory http.RoundTripper that answers from a script and
// records every attempt. It reads and closes each request body, as a real
// transport does, and counts the response bodies it hands out and how many
// were closed. Its time is time.Now, so inside a synctest bubble it records
// fake time.
type memBase struct {
	recorder
	steps  []step
	opened atomic.Int64
	closed atomic.Int64
}

func newMemBase(steps ...step) *memBase {
	if len(steps) == 0 {
		steps = []step{status(http.StatusOK)}
	}
	return &memBase{steps: steps}
}

func (b *memBase) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	i := b.add(req, body)
	s := b.steps[min(i, len(b.steps)-1)]
	if s.block {
		<-req.Context().Done()
		return nil, req.Context().Err()
	}
	if s.err != nil {
		return nil, s.err
	}
	code := s.status
	if code == 0 {
		code = http.StatusOK
	}
	h := s.header.Clone()
	if h == nil {
		h = http.Header{}
	}
	b.opened.Add(1)
	return &http.Response{
		Status:        strconv.Itoa(code) + " " + http.StatusText(code),
		StatusCode:    code,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		ContentLength: int64(len(s.body)),
		Body:          &memBody{r: bytes.NewReader([]byte(s.body)), ctx: req.Context(), closed: &b.closed},
		Request:       req,
	}, nil
}

// Open reports the response bodies handed out and not yet closed.
func (b *memBase) Open() int64 { return b.opened.Load() - b.closed.Load() }

// memBody fails reads once its request's context has ended, as a real
// transport's body does.
type memBody struct {
	r      *bytes.Reader
	ctx    context.Context
	closed *atomic.Int64
	once   sync.Once
}

func (b *memBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, err
	}
	return b.r.Read(p)
}

func (b *memBody) Close() error {
	b.once.Do(func() { b.closed.Add(1) })
	return nil
}

// flakyServer is an httptest.Server that answers from a script, records every
// attempt, and performs each POST's effect once per idempotency key, as a
// deduplicating API would.
type flakyServer struct {
	*httptest.Server
	recorder
	steps []step

	mu      sync.Mutex
	effects map[string]int // executions per idempotency key ("" for none)
	conns   atomic.Int64   // TCP connections accepted
}

func newFlakyServer(t *testing.T, steps ...step) *flakyServer {
	t.Helper()
	if len(steps) == 0 {
		steps = []step{status(http.StatusOK)}
	}
	s := &flakyServer{steps: steps, effects: map[string]int{}}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// Effects returns the number of times a write was really performed.
func (s *flakyServer) Effects() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.effects {
		n += c
	}
	return n
}

func (s *flakyServer) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	i := s.add(r, body)
	st := s.steps[min(i, len(s.steps)-1)]
	if st.reset {
		hijackAndClose(w, true)
		return
	}
	if r.Method == http.MethodPost {
		key := r.Header.Get(DefaultIdempotencyHeader)
		s.mu.Lock()
		if key == "" || s.effects[key] == 0 {
			s.effects[key]++
		}
		s.mu.Unlock()
	}
	if st.commitThenDrop {
		hijackAndClose(w, false)
		return
	}
	for k, vs := range st.header {
		w.Header()[k] = vs
	}
	code := st.status
	if code == 0 {
		code = http.StatusOK
	}
	w.WriteHeader(code)
	io.WriteString(w, st.body)
}

// hijackAndClose cuts the connection without a response; with rst it sends a
// TCP reset instead of a clean close.
func hijackAndClose(w http.ResponseWriter, rst bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	if tc, ok := conn.(*net.TCPConn); ok && rst {
		tc.SetLinger(0)
	}
	conn.Close()
}
