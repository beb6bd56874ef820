package retryhttp

// The project's own test helpers: requests, a round trip that reads the
// body, servers started over HTTP/1.1, HTTP/2 with TLS or unencrypted
// HTTP/2, and a client connection whose reads a test can steer. Scripted
// servers and transports come from retryhttptest; nothing here repeats them.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
	"github.com/stretchr/testify/require"
)

var fast = Policy{BaseDelay: time.Millisecond, ThrottleBaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond}

// Rand sources that pin the jitter to the ends of its window.
func highRand(n int64) int64 { return n - 1 }

func lowRand(int64) int64 { return 0 }

func newReq(t *testing.T, method, body string) *http.Request {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://example.test/path?token=secret", r)
	require.NoError(t, err)
	return req
}

// roundTrip runs req through tr and reads and closes the response body.
func roundTrip(t *testing.T, tr *Transport, req *http.Request) (int, string, error) {
	t.Helper()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		if resp != nil {
			t.Fatalf("RoundTrip returned a response and an error (%v)", err)
		}
		return 0, "", err
	}
	if resp == nil {
		t.Fatal("RoundTrip returned neither a response nor an error")
	}
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	if rerr != nil {
		t.Fatalf("reading the final body: %v", rerr)
	}
	return resp.StatusCode, string(b), nil
}

var errReset = &wrappedErr{syscall.ECONNRESET}

type wrappedErr struct{ err error }

func (e *wrappedErr) Error() string { return "read tcp: " + e.err.Error() }

func (e *wrappedErr) Unwrap() error { return e.err }

func mustReq(t *testing.T, method, url string) *http.Request {
	t.Helper()
	var body io.Reader
	if method == "POST" {
		body = strings.NewReader("{}")
	}
	req, err := http.NewRequest(method, url, body)
	require.NoError(t, err)
	return req
}

// closedURL returns the URL of a loopback port nothing listens on.
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr + "/"
}

// start starts srv over HTTP/1.1, or HTTP/2 with TLS, and returns a base
// transport that speaks to it, its idle connections closed at the end.
func start(t *testing.T, srv *rht.Server, http2 bool) *http.Transport {
	t.Helper()
	base := &http.Transport{}
	if http2 {
		srv.EnableHTTP2 = true
		srv.StartTLS()
		base = srv.Client().Transport.(*http.Transport)
	} else {
		srv.Start()
	}
	t.Cleanup(base.CloseIdleConnections)
	return base
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// startH2C starts an httptest server for handler that speaks unencrypted
// HTTP/2 only (prior knowledge), and returns it with a base transport that
// speaks the same to it. Unencrypted, the client's connection carries plain
// HTTP/2 frames that a steerConn can watch.
func startH2C(t *testing.T, handler http.Handler, base *http.Transport) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(handler)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	base.Protocols = new(http.Protocols)
	base.Protocols.SetUnencryptedHTTP2(true)
	t.Cleanup(base.CloseIdleConnections)
	return srv
}

// A steerConn is a client connection whose reads a test can steer: end them
// with io.EOF as if the server had closed the connection, freeze them as if
// the network had gone silent, or watch the HTTP/2 frames they carry.
type steerConn struct {
	net.Conn
	closed    chan struct{}
	closeOnce sync.Once

	mu     sync.Mutex
	eof    bool
	frozen bool
	frames *frameWatcher // nil: frames are not watched
	// eofAfterGoAway makes reads end with io.EOF once a whole GOAWAY frame
	// has been read: a server that sent GOAWAY and closed.
	eofAfterGoAway bool
}

func newSteerConn(c net.Conn) *steerConn {
	return &steerConn{Conn: c, closed: make(chan struct{}), frames: &frameWatcher{}}
}

// dialSteered returns a DialContext that wraps each connection in a
// steerConn and sends it to conns.
func dialSteered(conns chan<- *steerConn) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc := newSteerConn(c)
		conns <- sc
		return sc, nil
	}
}

func (c *steerConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	eof := c.eof
	c.mu.Unlock()
	if eof {
		return 0, io.EOF
	}
	n, err := c.Conn.Read(p)
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.frozen:
		c.mu.Unlock()
		<-c.closed
		c.mu.Lock()
		return 0, net.ErrClosed
	case c.eof:
		return 0, io.EOF
	}
	if n > 0 {
		c.frames.feed(p[:n])
		if c.eofAfterGoAway && c.frames.goAwayRead {
			c.eof = true
		}
	}
	return n, err
}

// EOF makes the read in progress, and every later one, end with io.EOF.
func (c *steerConn) EOF() {
	c.mu.Lock()
	c.eof = true
	c.mu.Unlock()
	c.Conn.SetReadDeadline(time.Unix(1, 0)) // ends a read blocked now
}

// Freeze makes reads deliver nothing more: they block until Close.
func (c *steerConn) Freeze() {
	c.mu.Lock()
	c.frozen = true
	c.mu.Unlock()
}

func (c *steerConn) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// frameWatcher follows the HTTP/2 frames of a server-to-client byte stream.
type frameWatcher struct {
	hdr        []byte
	skip       int  // payload bytes of the current frame still to come
	goAway     bool // the current frame is a GOAWAY
	goAwayRead bool // a whole GOAWAY frame has been read
}

func (w *frameWatcher) feed(p []byte) {
	for len(p) > 0 {
		if w.skip > 0 {
			k := min(w.skip, len(p))
			w.skip -= k
			p = p[k:]
		} else {
			k := min(9-len(w.hdr), len(p))
			w.hdr = append(w.hdr, p[:k]...)
			p = p[k:]
			if len(w.hdr) < 9 {
				continue
			}
			w.skip = int(w.hdr[0])<<16 | int(w.hdr[1])<<8 | int(w.hdr[2])
			w.goAway = w.hdr[3] == 0x7 // GOAWAY
			w.hdr = w.hdr[:0]
		}
		if w.skip == 0 && w.goAway {
			w.goAwayRead = true
		}
	}
}

// ledger is a Budget that issues every payment with a unique Mark and
// records every Withdraw and Refund. It flags a refund of Tokens it never
// issued (or issued with ok=false) and a second settlement of the same
// Tokens.
type ledger struct {
	mu       sync.Mutex
	t        *testing.T
	next     uint64
	issued   map[uint64]Class // paid and not yet refunded
	refunded map[uint64]bool  // the sent flag of each refund
	refuse   bool             // Withdraw reports false
	// refusedTokens: a refused Withdraw still returns a refund. The
	// interface says a refusal pays nothing, whatever it returned.
	refusedTokens bool
	errs          []string
}

func newLedger(t *testing.T) *ledger {
	return &ledger{t: t, issued: map[uint64]Class{}, refunded: map[uint64]bool{}}
}

func (l *ledger) Deposit(bool) {}

func (l *ledger) Withdraw(_ context.Context, c Class) (func(bool), bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.next++
	mark := l.next
	refund := func(sent bool) { l.refund(mark, sent) }
	if l.refuse {
		if l.refusedTokens {
			return refund, false
		}
		return nil, false
	}
	l.issued[mark] = c
	return refund, true
}

func (l *ledger) refund(mark uint64, sent bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.issued[mark]; !ok {
		if _, again := l.refunded[mark]; again {
			l.errs = append(l.errs, fmt.Sprintf("refund %d made twice", mark))
		} else {
			l.errs = append(l.errs, fmt.Sprintf("refund %d made but never issued as paid (sent=%v)", mark, sent))
		}
		return
	}
	delete(l.issued, mark)
	l.refunded[mark] = sent
}

func (l *ledger) Available() int { return 1 << 20 }

// unsettled is the number of paid Tokens never refunded.
func (l *ledger) unsettled() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.issued)
}

func (l *ledger) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, e := range l.errs {
		t.Error(e)
	}
}

// stallBody is a response body whose reads block until it is closed, as a
// server that sent its headers and then went silent.
type stallBody struct {
	once   sync.Once
	done   chan struct{}
	closed *atomic.Int32
}

func newStallBody(closed *atomic.Int32) *stallBody {
	return &stallBody{done: make(chan struct{}), closed: closed}
}

func (b *stallBody) Read([]byte) (int, error) {
	<-b.done
	return 0, errors.New("stallBody: closed")
}

func (b *stallBody) Close() error {
	b.once.Do(func() {
		close(b.done)
		if b.closed != nil {
			b.closed.Add(1)
		}
	})
	return nil
}

// panicHandler is a slog.Handler that panics on every record.
type panicHandler struct{}

func (panicHandler) Enabled(context.Context, slog.Level) bool { return true }

func (panicHandler) Handle(context.Context, slog.Record) error { panic("log handler") }

func (h panicHandler) WithAttrs([]slog.Attr) slog.Handler { return h }

func (h panicHandler) WithGroup(string) slog.Handler { return h }

// slowStartBody delays its first read, as a body whose first bytes come a
// little after the headers.
type slowStartBody struct {
	r    io.Reader
	d    time.Duration
	once sync.Once
}

func (b *slowStartBody) Read(p []byte) (int, error) {
	b.once.Do(func() { time.Sleep(b.d) })
	return b.r.Read(p)
}

func (b *slowStartBody) Close() error { return nil }

// countClose is a body that counts its Close calls.
type countClose struct {
	io.Reader
	n *atomic.Int32
}

func (c *countClose) Close() error { c.n.Add(1); return nil }

// ctxBG is the context of a Budget's withdrawals in tests that call it
// directly.
var ctxBG = context.Background()

// noKey is a NewIdempotencyKey that turns keys off.
func noKey() string { return "" }

// budgetInUse returns the budget t draws from: Budget, or the private one
// it made; nil with PerHost.
func (t *Transport) budgetInUse() Budget {
	t.once.Do(t.init)
	if t.PerHost != nil {
		return nil
	}
	return t.inUse
}

// size reports the most tokens the bucket holds.
func (b *tokenBucket) size() int { return int(b.capacity) }
