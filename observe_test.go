package retryhttp

import (
	"bytes"
	"encoding/json"
	"errors"
	rht "github.com/herdproof/retryhttp/retryhttptest"
	"log/slog"
	"net/url"
	"strings"
	"testing"
	"testing/synctest"
	"time"
)

func TestOnAttemptReportsEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(429).WithHeader("Retry-After", "1"), rht.Step{Err: errReset}, rht.Status(200))
		var got []Attempt
		tr := &Transport{Base: base, Policy: Policy{Rand: lowRand}, OnAttempt: func(a Attempt) { got = append(got, a) }}
		roundTrip(t, tr, newReq(t, "POST", "x"))
		want := []Attempt{
			{Number: 1, Status: 429, Class: Throttling, Decision: Retry, Delay: time.Second, DelaySource: FromServer, Tokens: 500 - ThrottleRetryCost},
			{Number: 2, Err: errReset, Class: Transient, Decision: Retry, Delay: 0, DelaySource: FromBackoff, Tokens: 500 - ThrottleRetryCost - RetryCost},
			{Number: 3, Status: 200, Class: Success, Decision: Done, Tokens: 500 - ThrottleRetryCost},
		}
		if len(got) != len(want) {
			t.Fatalf("got %d hook calls; want %d", len(got), len(want))
		}
		for i := range want {
			g := got[i]
			if g.Request == nil || g.Request.Header.Get(DefaultIdempotencyHeader) == "" {
				t.Errorf("attempt %d: got no request with a key in the hook", i+1)
			}
			g.Request = nil
			if !errors.Is(g.Err, want[i].Err) {
				t.Errorf("attempt %d: got error %v; want %v", i+1, g.Err, want[i].Err)
			}
			g.Err, want[i].Err = nil, nil
			if g != want[i] {
				t.Errorf("attempt %d:\n got %+v\nwant %+v", i+1, g, want[i])
			}
		}
	})
}

func TestLogger(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var buf bytes.Buffer
		logger := slog.New(slog.NewJSONHandler(&buf, nil))
		base := rht.NewTransport(rht.Status(503), rht.Step{Err: &url.Error{Op: "Get", URL: "http://user:pass@example.test/x?token=secret", Err: errReset}}, rht.Status(503))
		tr := &Transport{Base: base, Logger: logger, Policy: Policy{Rand: highRand}}
		req := newReq(t, "GET", "")
		req.URL.User = url.UserPassword("user", "pass")
		req.Header.Set("Authorization", "Bearer secret")
		roundTrip(t, tr, req)

		out := buf.String()
		for _, secret := range []string{"secret", "pass", "token="} {
			if strings.Contains(out, secret) {
				t.Errorf("log contains %q:\n%s", secret, out)
			}
		}
		lines := strings.Split(strings.TrimSpace(out), "\n")
		want := []struct{ msg, decision string }{
			{"retryhttp: retrying", "retry"},
			{"retryhttp: retrying", "retry"},
			{"retryhttp: giving up", "attempts exhausted"},
		}
		if len(lines) != len(want) {
			t.Fatalf("got %d lines; want %d:\n%s", len(lines), len(want), out)
		}
		for i, line := range lines {
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			if m["msg"] != want[i].msg || m["decision"] != want[i].decision || m["url"] != "http://example.test/path" {
				t.Errorf("line %d: got %v; want msg %q, decision %q, url without credentials or query", i+1, m, want[i].msg, want[i].decision)
			}
		}
	})
}

func TestErrorStringRedactsURL(t *testing.T) {
	err := &Error{Attempts: 2, Decision: StopBudget, Err: &url.Error{Op: "Post", URL: "https://u:p@api.test/v1?key=k", Err: errReset}}
	want := "retryhttp: retry budget exhausted after 2 attempts: Post https://api.test/v1: read tcp: connection reset by peer"
	if got := err.Error(); got != want {
		t.Errorf("got %q; want %q", got, want)
	}
}
