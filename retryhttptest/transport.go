package retryhttptest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Transport is an in-memory http.RoundTripper that answers from a script,
// with no network. It reads and closes each request body as a real transport
// does, and keeps count of the response bodies it hands out that are still
// open. Its zero value answers 200 to everything; NewTransport scripts it.
// It is safe for concurrent use.
type Transport struct {
	// KeyHeader, if set before first use, names the header that
	// Attempt.Key records and effects are deduplicated by, in place of the
	// package's KeyHeader.
	KeyHeader string

	once   sync.Once
	s      *script
	steps  []Step
	opened atomic.Int64
	closed atomic.Int64
}

// NewTransport returns a Transport that answers from steps.
func NewTransport(steps ...Step) *Transport {
	return &Transport{steps: steps}
}

func (t *Transport) script() *script {
	t.once.Do(func() { t.s = newScript(t.steps, t.KeyHeader) })
	return t.s
}

// Attempts returns a copy of the attempts received so far, in order.
func (t *Transport) Attempts() []Attempt { return t.script().Attempts() }

// Effects returns how many POST or PATCH effects were performed (see
// Server.Effects).
func (t *Transport) Effects() int { return t.script().Effects() }

// OpenBodies returns the number of response bodies handed out and not yet
// closed. A client that drains and closes what it discards leaves only the
// bodies it returned to its caller.
func (t *Transport) OpenBodies() int { return int(t.opened.Load() - t.closed.Load()) }

// connError is what a Reset or CommitThenDrop step returns.
type connError struct{ op string }

func (e *connError) Error() string { return e.op + ": connection reset by peer" }
func (e *connError) Unwrap() error { return syscall.ECONNRESET }

// RoundTrip answers req from the script.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body.Close()
	}
	s := t.script()
	st := s.record(req, body)
	ctx := req.Context()
	if st.Delay > 0 {
		timer := time.NewTimer(st.Delay)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
	}
	switch {
	case st.Hang:
		<-ctx.Done()
		return nil, ctx.Err()
	case st.Err != nil:
		return nil, st.Err
	case st.Reset:
		return nil, &connError{"write"}
	}
	s.effect(req)
	if st.CommitThenDrop {
		return nil, &connError{"read"}
	}
	c := code(st)
	h := st.Header.Clone()
	if h == nil {
		h = http.Header{}
	}
	t.opened.Add(1)
	return &http.Response{
		Status:        statusLine(c),
		StatusCode:    c,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		ContentLength: int64(len(st.Body)),
		Body:          &respBody{r: bytes.NewReader([]byte(st.Body)), ctx: ctx, closed: &t.closed},
		Request:       req,
	}, nil
}

// respBody fails reads once its request's context has ended, as a real
// transport's response body does, and counts its Close.
type respBody struct {
	r      *bytes.Reader
	ctx    context.Context
	closed *atomic.Int64
	once   sync.Once
}

func (b *respBody) Read(p []byte) (int, error) {
	if err := b.ctx.Err(); err != nil {
		return 0, fmt.Errorf("retryhttptest: reading the body: %w", err)
	}
	return b.r.Read(p)
}

func (b *respBody) Close() error {
	b.once.Do(func() { b.closed.Add(1) })
	return nil
}
