package retryhttptest

import (
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Server is an httptest.Server that answers from a script. Make one with
// NewServer; it closes itself when the test ends.
//
// net/http's client may send a request again by itself when a reused
// keep-alive connection turns out to be closed by the server (for GET, HEAD,
// OPTIONS, TRACE and requests carrying Idempotency-Key): the Server then
// records more attempts than the client's retry layer made.
type Server struct {
	*httptest.Server

	// KeyHeader, if set before Start (use NewUnstartedServer), names the
	// header that Attempt.Key records and effects are deduplicated by, in
	// place of the package's KeyHeader.
	KeyHeader string

	steps     []Step
	once      sync.Once
	s         *script
	conns     atomic.Int64
	closing   chan struct{}
	closeOnce sync.Once
}

// NewServer starts a Server on loopback that answers from steps, and closes
// it at the end of the test.
func NewServer(t testing.TB, steps ...Step) *Server {
	t.Helper()
	s := NewUnstartedServer(t, steps...)
	if s != nil {
		s.Start()
	}
	return s
}

// NewUnstartedServer returns a Server that is not started yet, so that its
// Config or TLS settings (EnableHTTP2, for one) can be changed first. Call
// Start or StartTLS; it closes itself at the end of the test.
func NewUnstartedServer(t testing.TB, steps ...Step) *Server {
	t.Helper()
	for i, st := range steps {
		if st.Err != nil {
			t.Fatalf("retryhttptest: step %d sets Err (%v), which a Server cannot send; use Reset or CommitThenDrop, or a Transport", i+1, st.Err)
			return nil
		}
	}
	s := &Server{steps: steps, closing: make(chan struct{})}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	s.configure()
	t.Cleanup(s.Close)
	return s
}

// Close releases hanging handlers, then shuts the server down and waits
// for its handlers to return. It may be called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.Server.Close()
}

func (s *Server) configure() {
	// Cut connections are the point of some steps: keep the log quiet.
	s.Config.ErrorLog = log.New(io.Discard, "", 0)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
}

func (s *Server) script() *script {
	s.once.Do(func() { s.s = newScript(s.steps, s.KeyHeader) })
	return s.s
}

// Start starts the server over HTTP/1.1 (or HTTP/2 if EnableHTTP2 is set,
// with StartTLS).
func (s *Server) Start() {
	s.script()
	s.Server.Start()
}

// StartTLS starts the server with TLS.
func (s *Server) StartTLS() {
	s.script()
	s.Server.StartTLS()
}

// Attempts returns a copy of the attempts received so far, in order.
func (s *Server) Attempts() []Attempt { return s.script().Attempts() }

// Effects returns how many POST or PATCH effects were performed: one per
// distinct idempotency key, plus one per write that carried none.
func (s *Server) Effects() int { return s.script().Effects() }

// Conns returns the number of connections the Server has accepted: with
// keep-alive working, far fewer than attempts.
func (s *Server) Conns() int { return int(s.conns.Load()) }

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	sc := s.script()
	st := sc.record(r, body)
	if st.Delay > 0 {
		select {
		case <-time.After(st.Delay):
		case <-r.Context().Done():
			return
		case <-s.closing:
			// Returning would send an implicit 200: cut the connection.
			cut(w, true)
			return
		}
	}
	switch {
	case st.Hang:
		select {
		case <-r.Context().Done():
		case <-s.closing:
			cut(w, true) // never answer, not even an implicit 200
		}
		return
	case st.Reset:
		cut(w, true)
		return
	}
	sc.effect(r)
	if st.CommitThenDrop {
		cut(w, true)
		return
	}
	for k, vs := range st.Header {
		w.Header()[k] = vs
	}
	w.WriteHeader(code(st))
	io.WriteString(w, st.Body)
}

// cut closes the connection under a handler without a response; with rst,
// as a TCP reset.
func cut(w http.ResponseWriter, rst bool) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// HTTP/2 cannot hijack: abort the stream instead.
		panic(http.ErrAbortHandler)
	}
	if rst {
		// Under TLS, reset the TCP connection beneath it: closing the
		// *tls.Conn would first send close_notify, an orderly close.
		if tc, ok := conn.(interface{ NetConn() net.Conn }); ok {
			conn = tc.NetConn()
		}
		if tc, ok := conn.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
	}
	conn.Close()
}
