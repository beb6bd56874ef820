package retryhttp

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// Bad input from servers: every odd delay header, through the Transport.
// None may panic, hang, or wait longer than the policy allows.
func TestBadServerDelays(t *testing.T) {
	const (
		seconds = "Retry-After"
		amz     = "X-Amz-Retry-After"
		ms      = "Retry-After-Ms"
	)
	// Fake time in a synctest bubble starts at 2000-01-01 00:00:00 UTC.
	start := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	type want struct {
		attempts   int           // 1: returned at once; 2: retried
		low, high  time.Duration // the wait, lowRand and highRand
		fromServer bool
	}
	backoff := want{2, 0, 50 * time.Millisecond, false}
	refused := want{1, 0, 0, true}
	values := []struct {
		name   string
		values []string
		byName map[string]want // default: backoff
	}{
		{"negative", []string{"-5"}, nil},
		{"empty", []string{""}, nil},
		{"Go duration", []string{"1m0s"}, nil},
		{"fraction", []string{"0.493"}, nil},
		{"spaces around", []string{" 120 "}, map[string]want{
			seconds: refused,                                                   // 120s > MaxDelay
			amz:     {2, 120 * time.Millisecond, 170 * time.Millisecond, true}, // spread: BaseDelay, above 10%
			ms:      {2, 120 * time.Millisecond, 170 * time.Millisecond, true},
		}},
		{"two different", []string{"3", "4"}, nil},
		{"two equal", []string{"3", "3"}, map[string]want{
			seconds: {2, 3 * time.Second, 3300 * time.Millisecond, true},
			amz:     {2, 3 * time.Millisecond, 53 * time.Millisecond, true},
			ms:      {2, 3 * time.Millisecond, 53 * time.Millisecond, true},
		}},
		{"eleven digits", []string{"99999999999"}, map[string]want{seconds: refused, amz: refused, ms: refused}},
		{"thirty digits", []string{strings.Repeat("1234567890", 3)}, map[string]want{seconds: refused, amz: refused, ms: refused}},
		{"past date", []string{start.Add(-time.Hour).Format(http.TimeFormat)}, map[string]want{seconds: {2, 0, 50 * time.Millisecond, true}}},
		{"date 10 years ahead", []string{start.AddDate(10, 0, 0).Format(http.TimeFormat)}, map[string]want{seconds: refused}},
		{"IMF-fixdate", []string{"Sat, 01 Jan 2000 00:00:05 GMT"}, map[string]want{seconds: {2, 5 * time.Second, 5500 * time.Millisecond, true}}},
		{"RFC 850 date", []string{"Saturday, 01-Jan-00 00:00:05 GMT"}, map[string]want{seconds: {2, 5 * time.Second, 5500 * time.Millisecond, true}}},
		{"asctime date", []string{"Sat Jan  1 00:00:05 2000"}, map[string]want{seconds: {2, 5 * time.Second, 5500 * time.Millisecond, true}}},
		{"malformed date", []string{"Sat, 01 Jan 2000 25:61:00 GMT"}, nil},
	}
	for _, header := range []string{seconds, amz, ms} {
		for _, v := range values {
			w, ok := v.byName[header]
			if !ok {
				w = backoff
			}
			for _, end := range []struct {
				name string
				rnd  func(int64) int64
				wait time.Duration
			}{{"low", lowRand, w.low}, {"high", highRand, w.high}} {
				t.Run(header+"/"+v.name+"/"+end.name, func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						if !time.Now().Equal(start) {
							t.Fatalf("the bubble starts at %v; want %v", time.Now(), start)
						}
						step := rht.Status(503)
						step.Header = http.Header{header: v.values}
						base := rht.NewTransport(step, rht.Status(200))
						var hooks []Attempt
						tr := &Transport{Base: base, Policy: Policy{Rand: end.rnd}, OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
						_, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
						if err != nil {
							t.Fatalf("got %v; want a response", err)
						}
						if !rht.AssertAttempts(t, base, w.attempts) {
							return
						}
						if w.attempts == 2 {
							if gap := rht.Gaps(base)[0]; gap != end.wait {
								t.Errorf("got wait %v; want %v", gap, end.wait)
							}
						}
						if got := hooks[0].DelaySource == FromServer; got != w.fromServer {
							t.Errorf("got delay from server %v; want %v", got, w.fromServer)
						}
						if w.attempts == 1 && hooks[0].Decision != StopServerDelay {
							t.Errorf("got decision %v; want %v", hooks[0].Decision, StopServerDelay)
						}
					})
				})
			}
		}
	}
}

// countingReader yields n bytes of 'x' without holding them, and counts what
// was read.
type countingReader struct {
	left, read int64
	failAfter  int64 // > 0: fail once this many bytes were read
	closed     atomic.Bool
}

var errMidBody = errors.New("body broke mid-read")

func (r *countingReader) Read(p []byte) (int, error) {
	if r.failAfter > 0 && r.read >= r.failAfter {
		return 0, errMidBody
	}
	if r.left == 0 {
		return 0, io.EOF
	}
	n := min(int64(len(p)), r.left)
	if r.failAfter > 0 {
		n = min(n, r.failAfter-r.read)
	}
	for i := range p[:n] {
		p[i] = 'x'
	}
	r.left -= n
	r.read += n
	return int(n), nil
}

func (r *countingReader) Close() error { r.closed.Store(true); return nil }

// bodyBase answers the first attempt with a 503 carrying the given body and
// every later one with a 200.
type bodyBase struct {
	body  io.ReadCloser
	calls atomic.Int32
}

func (b *bodyBase) RoundTrip(req *http.Request) (*http.Response, error) {
	if b.calls.Add(1) == 1 {
		return &http.Response{StatusCode: 503, Header: http.Header{}, Body: b.body, Request: req}, nil
	}
	return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: req}, nil
}

func TestDiscardedBodies(t *testing.T) {
	t.Run("a 10 MB body is drained only to the limit", func(t *testing.T) {
		body := &countingReader{left: 10 << 20}
		tr := &Transport{Base: &bodyBase{body: body}, Policy: Policy{Rand: lowRand}}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		runtime.ReadMemStats(&after)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want (200, nil)", code, err)
		}
		if body.read != drainLimit {
			t.Errorf("got %d bytes drained; want %d", body.read, drainLimit)
		}
		if !body.closed.Load() {
			t.Error("the discarded body was not closed")
		}
		if grew := after.TotalAlloc - before.TotalAlloc; grew > 256<<10 {
			t.Errorf("got %d bytes allocated for a retry over a 10 MB body; want under 256 KiB", grew)
		}
	})
	t.Run("a body that breaks mid-read is closed and the retry goes on", func(t *testing.T) {
		body := &countingReader{left: 1 << 20, failAfter: 100}
		tr := &Transport{Base: &bodyBase{body: body}, Policy: Policy{Rand: lowRand}}
		code, _, err := roundTrip(t, tr, newReq(t, "GET", ""))
		if err != nil || code != 200 || !body.closed.Load() {
			t.Errorf("got (%d, %v, closed %v); want (200, nil, closed)", code, err, body.closed.Load())
		}
	})
	t.Run("a 10 MB 503 over loopback", func(t *testing.T) {
		srv := rht.NewServer(t, rht.Status(503).WithBody(strings.Repeat("x", 10<<20)), rht.Status(200).WithBody("ok"))
		tr := &Transport{Policy: fast}
		code, body, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL))
		if err != nil || code != 200 || body != "ok" {
			t.Errorf("got (%d, %q, %v); want (200, ok, nil)", code, body, err)
		}
		// Not drained to the end: that connection was closed, a new one made.
		if got := srv.Conns(); got != 2 {
			t.Errorf("got %d connections; want 2", got)
		}
	})
}

// Secrets in the URL and in headers never reach errors, hook strings or logs.
func TestSecretsStayOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dialErr := &url.Error{Op: "Get", URL: "https://alice:hunter2@api.test/v1?token=s3cr3t", Err: errDial}
		base := rht.NewTransport(rht.Status(503), rht.Step{Err: dialErr})
		var buf strings.Builder
		var printed []string
		tr := &Transport{
			Base:   base,
			Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})),
			OnAttempt: func(a Attempt) {
				printed = append(printed, a.String(), fmt.Sprintf("%v", a), fmt.Sprintf("%+v", a))
				slog.New(slog.NewJSONHandler(&buf, nil)).Info("hook", "attempt", a)
			},
			Policy: Policy{MaxAttempts: 2},
		}
		req, _ := http.NewRequest("GET", "https://alice:hunter2@api.test/v1?token=s3cr3t#frag", nil)
		req.Header.Set("Authorization", "Bearer s3cr3t")
		req.Header.Set("Cookie", "session=s3cr3t")
		_, err := tr.RoundTrip(req)
		if err == nil {
			t.Fatal("got no error; want the dial error")
		}
		all := strings.Join(append(printed, err.Error(), buf.String()), "\n")
		for _, secret := range []string{"hunter2", "s3cr3t", "alice", "token=", "frag", "Bearer"} {
			if strings.Contains(all, secret) {
				t.Errorf("found %q in:\n%s", secret, all)
			}
		}
		if !strings.Contains(all, "https://api.test/v1") {
			t.Errorf("the redacted URL is missing:\n%s", all)
		}
	})
}
