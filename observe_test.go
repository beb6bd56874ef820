package retryhttp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestOnAttemptReportsEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(429).WithHeader("Retry-After", "1"), rht.Step{Err: errReset}, rht.Status(200))
		var got []Attempt
		tr := &Transport{Base: base, Policy: Policy{Rand: lowRand}, OnAttempt: func(a Attempt) { got = append(got, a) }}
		roundTrip(t, tr, newReq(t, "POST", "x"))
		want := []Attempt{
			{Number: 1, Status: 429, Class: Throttling, Decision: Retry, Delay: time.Second, ServerDelay: true, tokens: 500 - ThrottleRetryCost},
			{Number: 2, Err: errReset, Class: Transient, Retrying: Throttling, Decision: Retry, Delay: 0, ServerDelay: false, tokens: 500 - ThrottleRetryCost - RetryCost},
			{Number: 3, Status: 200, Class: Success, Retrying: Transient, Decision: Done, tokens: 500 - ThrottleRetryCost},
		}
		if len(got) != len(want) {
			t.Fatalf("got %d hook calls; want %d", len(got), len(want))
		}
		for i := range want {
			g := got[i]
			if g.Request == nil || g.Request.Header.Get(defaultIdempotencyHeader) == "" {
				t.Errorf("attempt %d: got no request with a key in the hook", i+1)
			}
			g.Request, g.url = nil, nil
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
	err := &Error{Report: Report{Attempts: 2, Decision: StopBudget, Err: &url.Error{Op: "Post", URL: "https://u:p@api.test/v1?key=k", Err: errReset}}}
	want := "retryhttp: retry budget exhausted after 2 attempts: Post https://api.test/v1: read tcp: connection reset by peer"
	if got := err.Error(); got != want {
		t.Errorf("got %q; want %q", got, want)
	}
}

func TestErrorReportsTimeout(t *testing.T) {
	// As the http.Client sees it: (*url.Error).Timeout and errors.As to
	// net.Error must say "timeout" where the base's own error would.
	tests := []struct {
		name     string
		policy   Policy
		deadline time.Duration // the caller's, 0 for none
		want     bool
	}{
		{"caller's deadline", Policy{}, time.Second, true},
		{"Policy.Timeout", Policy{Timeout: time.Second}, 0, true},
		{"every attempt timed out", Policy{AttemptTimeout: time.Second, MaxAttempts: 2}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &Transport{Base: rht.NewTransport(rht.Hang()), Policy: tc.policy}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://x.test/", nil)
				_, err := (&http.Client{Transport: tr}).Do(req)
				var ue *url.Error
				if !errors.As(err, &ue) || ue.Timeout() != tc.want {
					t.Errorf("got %v (url.Error.Timeout %v); want Timeout() %v", err, ue != nil && ue.Timeout(), tc.want)
				}
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("errors.As(err, net.Error): got %v; want a net.Error reporting a timeout", ne)
				}
			})
		})
	}
	t.Run("not a timeout", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			tr := &Transport{Base: rht.NewTransport(rht.Step{Err: errReset}), Policy: Policy{MaxAttempts: 1}}
			_, err := tr.RoundTrip(newReq(t, "GET", ""))
			var re *Error
			if !errors.As(err, &re) || re.Timeout() {
				t.Errorf("got %v; want an *Error that is not a timeout", err)
			}
		})
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

// fallbackBudget is a shared budget that says it pays from its local
// fallback (as redisbudget's does while Redis is down).
type fallbackBudget struct{ *tokenBucket }

func (fallbackBudget) Fallback() (bool, error) { return true, errors.New("store down") }

// With PerHost, the destination's budget pays for the retries, and the
// Attempt must say when that budget is falling back. observe reads the
// Transport's own (unused) budget instead.
func TestBudgetFallbackReportedPerHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		tr   func(base http.RoundTripper) *Transport
	}{
		{"Budget", func(base http.RoundTripper) *Transport {
			return &Transport{Base: base, Policy: fast, Budget: fallbackBudget{newTokenBucket(500)}}
		}},
		{"PerHost", func(base http.RoundTripper) *Transport {
			return &Transport{Base: base, Policy: fast,
				PerHost: &PerHost{Budget: func(string) Budget { return fallbackBudget{newTokenBucket(500)} }}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var seen []Attempt
			tr := tc.tr(rht.NewTransport(rht.Status(503), rht.Status(200)))
			tr.OnAttempt = func(a Attempt) { seen = append(seen, a) }
			req, _ := http.NewRequest("GET", "http://a.test/", nil)
			if _, _, err := roundTrip(t, tr, req); err != nil {
				t.Fatal(err)
			}
			if len(seen) != 2 {
				t.Fatalf("got %d attempts; want 2", len(seen))
			}
			if !seen[0].budgetFallback {
				t.Errorf("attempt 1: got budgetFallback false; want true (the destination's budget is falling back)")
			}
		})
	}
}

// Error's text drops whatever wraps a *url.Error in its cause: a wait
// canceled after an attempt whose error was a url.Error (a base built on an
// http.Client, an SDK's adapter) loses "context canceled; last attempt:".
func TestErrorTextKeepsWhatWrapsAURLError(t *testing.T) {
	ue := func(u string) error {
		return &url.Error{Op: "Get", URL: u, Err: errors.New("connection refused")}
	}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"wrapped", fmt.Errorf("%w; last attempt: %w", context.Canceled, ue("http://h/p?token=secret")),
			"context canceled; last attempt: Get http://h/p: connection refused"},
		{"joined", errors.Join(ue("http://a/x?token=secret"), ue("http://u:secret@b/y")),
			"Get http://a/x: connection refused\nGet http://b/y: connection refused"},
		{"bare", ue("http://h/p?token=secret"), "Get http://h/p: connection refused"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := &Error{Report: Report{Attempts: 1, Decision: StopCanceled, Err: tc.err}}
			want := "retryhttp: canceled after 1 attempt: " + tc.want
			if got := err.Error(); got != want {
				t.Errorf("got %q; want %q", got, want)
			}
		})
	}
}

// Attempt.Retrying names the failure each attempt retries: Success for the
// first, then the class of the attempt before it.
func TestAttemptRetrying(t *testing.T) {
	var got []Class
	tr := &Transport{Base: rht.NewTransport(rht.Status(503), rht.Status(429), rht.Status(200)), Policy: fast,
		OnAttempt: func(a Attempt) { got = append(got, a.Retrying) }}
	if _, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil {
		t.Fatal(err)
	}
	want := []Class{Success, Transient, Throttling}
	if !slices.Equal(got, want) {
		t.Errorf("got Retrying %v; want %v", got, want)
	}
}

// Whatever wraps a *url.Error is kept in Error's text, but never a secret
// of its URL (user info, query, fragment) that the wrapper printed itself:
// then the text is the first url.Error's, redacted, alone.
func TestErrorTextNeverShowsAURLSecret(t *testing.T) {
	const raw = "http://user:pw@h.test/p?token=secret#frag"
	ue := &url.Error{Op: "Get", URL: raw, Err: errors.New("connection refused")}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"wrapper prints the URL", fmt.Errorf("fetching %s: %w", raw, ue)},
		{"wrapper prints the error twice", fmt.Errorf("%v; again: %w", ue, ue)},
		{"wrapper prints the query", fmt.Errorf("query token=secret: %w", ue)},
		{"nested", &url.Error{Op: "Post", URL: "http://h.test/outer?k=v2", Err: ue}},
		{"joined", errors.Join(ue, fmt.Errorf("retry of %s: %w", raw, ue))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := (&Error{Report: Report{Attempts: 1, Decision: StopCanceled, Err: tc.err}}).Error()
			for _, secret := range []string{"pw", "token=secret", "frag", "k=v2"} {
				if strings.Contains(got, secret) {
					t.Errorf("got %q; want no %q in it", got, secret)
				}
			}
		})
	}
}

// quotedErr wraps an error and renders it quoted, as a JSON or log encoder
// that escapes its cause would.
type quotedErr struct{ err error }

func (e quotedErr) Error() string { return "upstream: " + strconv.Quote(e.err.Error()) }
func (e quotedErr) Unwrap() error { return e.err }

// errString must never show more of a URL's secrets than it did before it
// kept the text around a *url.Error: before, any chain with a *url.Error in
// it came out as that url.Error's redacted text alone.
func TestErrorTextNeverShowsAURLSecretInOtherShapes(t *testing.T) {
	ue := func(u string) *url.Error {
		return &url.Error{Op: "Get", URL: u, Err: errors.New("connection refused")}
	}
	const secret = "SECRET"
	tests := []struct {
		name string
		err  error
	}{
		// The same url.Error's text twice in the message, once in the chain:
		// only the first occurrence is replaced.
		{"text twice, wrapped once", func() error {
			e := ue("http://h/p?token=" + secret)
			return fmt.Errorf("%v (cause: %w)", e, e)
		}()},
		// The wrapper names the URL itself, as "fetch %s: %w" does.
		{"URL outside the url.Error", func() error {
			e := ue("http://u:" + secret + "@h/p")
			return fmt.Errorf("fetch %s: %w", e.URL, e)
		}()},
		// Two url.Errors with one redacted text: the second is rendered
		// quoted (its raw text is not found), and the first one's
		// replacement makes its redacted form look present.
		{"second rendered otherwise, same redacted text", errors.Join(
			ue("http://h/p?token=a"),
			quotedErr{ue("http://h/p?token=" + secret)})},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := &Error{Report: Report{Attempts: 1, Decision: Done, Err: tc.err}}
			if got := e.Error(); strings.Contains(got, secret) {
				t.Errorf("Error() = %q; want no %q in it", got, secret)
			}
			a := Attempt{Number: 1, Err: tc.err, Class: Permanent, Decision: Done}
			if got := a.String(); strings.Contains(got, secret) {
				t.Errorf("Attempt.String() = %q; want no %q in it", got, secret)
			}
		})
	}
}

// Held: Attempt.Retrying and Number stay consistent under hedging,
// AttemptTimeout, Override.MaxAttempts and PerHost: the first attempt
// retries nothing, every later one retries the class of the one before,
// and numbers follow the hedges.
func TestRetryingConsistent(t *testing.T) {
	tests := []struct {
		name  string
		tr    func() *Transport
		ctx   func(context.Context) context.Context
		steps []rht.Step
	}{
		{"hedged", func() *Transport {
			return &Transport{Policy: Policy{BaseDelay: time.Millisecond, MaxAttempts: 6, HedgeDelay: 5 * time.Millisecond, HedgeRatio: 1}}
		}, nil, []rht.Step{rht.Status(503).WithDelay(20 * time.Millisecond), rht.Status(503), rht.Status(429), rht.Status(200)}},
		{"attempt timeout", func() *Transport {
			return &Transport{Policy: Policy{BaseDelay: time.Millisecond, AttemptTimeout: 10 * time.Millisecond}}
		}, nil, []rht.Step{rht.Hang(), rht.Status(429), rht.Status(200)}},
		{"override max attempts", func() *Transport {
			return &Transport{Policy: Policy{BaseDelay: time.Millisecond, ThrottleBaseDelay: time.Millisecond, MaxAttempts: 2}}
		}, func(ctx context.Context) context.Context { return WithOverride(ctx, Override{MaxAttempts: 5}) },
			[]rht.Step{rht.Status(503), rht.Status(429), rht.Status(502), rht.Status(200)}},
		{"per host", func() *Transport {
			return &Transport{PerHost: &PerHost{}, Policy: Policy{BaseDelay: time.Millisecond, ThrottleBaseDelay: time.Millisecond}}
		}, nil, []rht.Step{rht.Status(429), rht.Status(503), rht.Status(200)}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { // the waits take no real time
				tr := tc.tr()
				tr.Base = rht.NewTransport(tc.steps...)
				var hooked []Attempt
				tr.OnAttempt = func(a Attempt) { hooked = append(hooked, a) }
				var rep Report
				ctx := WithReport(context.Background(), &rep)
				if tc.ctx != nil {
					ctx = tc.ctx(ctx)
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", "http://example.test/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if len(hooked) != len(rep.History) {
					t.Fatalf("hook saw %d attempts, Report %d", len(hooked), len(rep.History))
				}
				next := 1
				for i, a := range hooked {
					if a.Number != next {
						t.Errorf("attempt %d: Number %d; want %d", i, a.Number, next)
					}
					next = a.Number + a.Hedges + 1
					want := Success
					if i > 0 {
						want = hooked[i-1].Class
					}
					if a.Retrying != want || rep.History[i].Retrying != want {
						t.Errorf("attempt %d: Retrying %v (Report %v); want %v", i, a.Retrying, rep.History[i].Retrying, want)
					}
				}
			})
		})
	}
}

// errString keeps the text around a *url.Error unless a secret of its URL
// is still in it; the secrets it looks for are the whole raw query, the
// user info and the fragment. A wrapper that prints part of the query (one
// parameter, the decoded query, the parsed values) puts a secret in the
// text, which before 5c04a5a never showed (any chain with a url.Error came
// out as that url.Error's redacted text alone).
func TestErrorTextNeverShowsPartOfAQuery(t *testing.T) {
	const raw = "https://api.test/v1/items?page=2&access_token=S3CRET%2Fx"
	u, _ := url.Parse(raw)
	ue := &url.Error{Op: "Get", URL: raw, Err: errors.New("connection reset by peer")}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"one parameter", fmt.Errorf("token %s rejected: %w", u.Query().Get("access_token"), ue)},
		{"parsed values", fmt.Errorf("listing %v: %w", u.Query(), ue)},
		{"decoded query", fmt.Errorf("query %s: %w", mustString(url.QueryUnescape(u.RawQuery)), ue)},
		{"re-encoded query", fmt.Errorf("query %s: %w", u.Query().Encode(), ue)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := (&Error{Report: Report{Attempts: 1, Decision: Done, Err: tc.err}}).Error()
			if strings.Contains(got, "S3CRET") {
				t.Errorf("got %q; want no %q in it", got, "S3CRET")
			}
		})
	}
}

// mustString returns s, or panics with err.
func mustString(s string, err error) string {
	if err != nil {
		panic(err)
	}
	return s
}

// The user name of an API-key URL (https://KEY:@host, as Stripe's basic
// auth) is its secret; a fragment's values too (#access_token=...).
func TestErrorTextNeverShowsAUserNameOrFragmentValue(t *testing.T) {
	for _, tc := range []struct {
		raw, shown string
	}{
		{"https://sk_test_S3CRET:@api.test/v1/charges", "sk_test_S3CRET"},
		{"https://app.test/cb#access_token=S3CRET&state=abc", "S3CRET"},
	} {
		u, _ := url.Parse(tc.raw)
		_ = u
		ue := &url.Error{Op: "Post", URL: tc.raw, Err: errors.New("EOF")}
		err := fmt.Errorf("as %s (%w)", tc.shown, ue)
		if got := (&Error{Report: Report{Attempts: 1, Decision: Done, Err: err}}).Error(); strings.Contains(got, "S3CRET") {
			t.Errorf("got %q; want no %q in it", got, "S3CRET")
		}
	}
}

// A base that names the request's URL in its own error text, not in a
// *url.Error (go-retryablehttp's "GET <url> giving up", a wrapper's
// "calling <url>: %w"): the Transport knows the request's URL, and keeps its
// secrets out of Error's text, Attempt.String and its log lines, showing
// the URL redacted.
func TestErrorTextNeverShowsTheRequestsSecrets(t *testing.T) {
	const raw = "https://alice:hunter2@api.test/v1?token=s3cr3t%2Fx&page=2#frag-secret"
	tests := []struct {
		name string
		text func(r *http.Request) string
		keep string // what of the text must stay
	}{
		{"go-retryablehttp's", func(r *http.Request) string { return r.Method + " " + r.URL.String() + " giving up after 1 attempt(s)" }, "GET https://api.test/v1 giving up"},
		{"a wrapper's", func(r *http.Request) string { return "calling " + r.URL.String() }, "calling https://api.test/v1"},
		{"the URL's own Redacted", func(r *http.Request) string { return "calling " + r.URL.Redacted() }, "calling https://alice:"},
		{"a query value, decoded", func(r *http.Request) string { return "token " + r.URL.Query().Get("token") + " refused" }, "refused"},
		{"the user info alone", func(r *http.Request) string { return "auth " + r.URL.User.String() }, "auth "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				return nil, fmt.Errorf("%s: %w", tt.text(r), syscall.ECONNRESET)
			})
			var log bytes.Buffer
			var printed []string
			tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 2, BaseDelay: 1},
				Logger:    slog.New(slog.NewTextHandler(&log, nil)),
				OnAttempt: func(a Attempt) { printed = append(printed, a.String()) }}
			_, err := tr.RoundTrip(mustReq(t, "GET", raw))
			if err == nil {
				t.Fatal("got no error; want the base's")
			}
			for _, w := range []struct{ where, text string }{
				{"Error()", err.Error()}, {"Attempt.String", strings.Join(printed, "\n")}, {"the log", log.String()},
			} {
				for _, secret := range []string{"hunter2", "s3cr3t", "frag-secret"} {
					if strings.Contains(w.text, secret) {
						t.Errorf("%s carries %q: %s", w.where, secret, strings.TrimSpace(w.text))
					}
				}
				if !strings.Contains(w.text, tt.keep) {
					t.Errorf("%s lost %q: %s", w.where, tt.keep, strings.TrimSpace(w.text))
				}
			}
		})
	}
}

// The RoundTripper contract lets the caller change or reuse its request once
// RoundTrip has returned (a polling loop that re-signs its query, a pager
// that sets the next token): an error printed after that is still redacted
// with the URL it was sent to, a copy the error keeps (it used to keep the
// caller's URL, and printed the old token once the caller set a new one).
func TestErrorTextAfterTheCallerReusesItsRequest(t *testing.T) {
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		// go-retryablehttp's shape, which 7f66616 set out to redact
		return nil, fmt.Errorf("%s %s giving up after 1 attempt(s): %w", r.Method, r.URL, syscall.ECONNRESET)
	})
	tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 1}}
	req := mustReq(t, "GET", "https://api.test/v1/items?token=first-secret-1111")
	_, err := tr.RoundTrip(req)
	if err == nil {
		t.Fatal("want an error")
	}
	before := err.Error()
	// The request is the caller's again: the next page, a new token.
	req.URL.RawQuery = "token=second-secret-2222"
	after := err.Error()
	if strings.Contains(before, "first-secret") {
		t.Fatalf("setup: redaction failed even before reuse: %s", before)
	}
	if strings.Contains(after, "first-secret") {
		t.Errorf("the same *Error, formatted after the caller reused its request, carries the first token:\nbefore reuse: %s\nafter reuse:  %s", before, after)
	}
}

// The same through a Report: an attempt that failed keeps a copy of the URL
// it was sent to, and Attempt.String redacts with it, not with whatever the
// caller's request holds when it is printed.
func TestReportAttemptTextAfterTheCallerReusesItsRequest(t *testing.T) {
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		return nil, fmt.Errorf("%s %s giving up: %w", r.Method, r.URL, syscall.ECONNRESET)
	})
	tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 1}}
	var rep Report
	req := mustReq(t, "GET", "https://api.test/v1/items?token=first-secret-1111")
	req = req.WithContext(WithReport(req.Context(), &rep))
	tr.RoundTrip(req)
	req.URL.RawQuery = "token=second-secret-2222"
	if len(rep.History) != 1 {
		t.Fatalf("got %d attempts", len(rep.History))
	}
	if s := rep.History[0].String(); strings.Contains(s, "first-secret") {
		t.Errorf("Report's attempt, printed after the caller reused its request, carries the first token: %s", s)
	}
}

// An error handed to an asynchronous logger while the caller goes on with
// its request: Error() reads the error's own copy of the URL, never the
// caller's (the race detector reported a race when it read the caller's).
func TestErrorTextDoesNotRaceTheCallersNextRequest(t *testing.T) {
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		return nil, errors.New("connection reset")
	})
	tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 1}}
	req := mustReq(t, "GET", "https://api.test/v1/items?token=first-secret-1111")
	_, err := tr.RoundTrip(req)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // the logger
		defer wg.Done()
		_ = err.Error()
	}()
	req.URL.RawQuery = "token=second-secret-2222" // allowed: RoundTrip returned
	wg.Wait()
}

// Redaction takes out secrets, not words: a short query value
// (GitHub's ?state=closed) is not taken out of net/http's own wording, and a
// value that is part of the URL's host or scheme (?region=eu-west-1,
// ?proto=https) does not garble the redacted URL shown.
func TestErrorTextKeepsWhatIsNotASecret(t *testing.T) {
	tests := []struct {
		name, raw, msg, keep string
	}{
		{"net/http's wording", "https://api.github.com/repos/o/r/issues?state=closed",
			"http: server closed idle connection", "server closed idle connection"},
		{"the host", "https://s3.eu-west-1.amazonaws.com/bucket/key?region=eu-west-1",
			"connection reset by peer", "https://s3.eu-west-1.amazonaws.com/bucket/key"},
		{"the scheme", "https://api.test/v1/callback?proto=https",
			"connection reset by peer", "https://api.test/v1/callback"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				return nil, &url.Error{Op: "Get", URL: r.URL.String(), Err: errors.New(tt.msg)}
			})
			tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 1}}
			_, err := tr.RoundTrip(mustReq(t, "GET", tt.raw))
			if got := err.Error(); !strings.Contains(got, tt.keep) {
				t.Errorf("Error() lost %q, which is no secret:\n%s", tt.keep, got)
			}
		})
	}
}

// errTextOf runs one GET of raw through a Transport whose base fails with
// mk's error, and returns the *Error's text.
func errTextOf(t *testing.T, raw string, mk func(r *http.Request) error) string {
	t.Helper()
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) { return nil, mk(r) })
	tr := &Transport{Base: base, Policy: Policy{MaxAttempts: 1}}
	_, err := tr.RoundTrip(mustReq(t, "GET", raw))
	if err == nil {
		t.Fatal("want an error")
	}
	return err.Error()
}

// A URL whose redacted form is empty (only a query or a fragment, which a
// base of one's own may take): its secrets are still replaced.
func TestErrorTextOfAURLWithOnlyAQueryOrFragment(t *testing.T) {
	tests := []struct {
		name, raw, secret string
		mk                func(r *http.Request) error
	}{
		{"query only", "?token=supersecret-1", "supersecret-1", func(r *http.Request) error {
			return fmt.Errorf("token %s rejected", r.URL.Query().Get("token"))
		}},
		{"fragment only", "#access_token=supersecret-1", "supersecret-1", func(r *http.Request) error {
			return fmt.Errorf("fragment %s rejected", r.URL.Fragment)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errTextOf(t, tt.raw, tt.mk); strings.Contains(got, tt.secret) {
				t.Errorf("Error() shows the secret %q: %q", tt.secret, got)
			}
		})
	}
}

// A secret that holds the redacted URL (a same-origin return_to or next in
// the query) is still replaced whole.
func TestErrorTextOfASecretHoldingTheURL(t *testing.T) {
	tests := []struct {
		name, raw, secret string
		mk                func(r *http.Request) error
	}{
		{"the raw query printed", "https://api.test/?return_to=https://api.test/home&sig=abc12", "sig=abc12",
			func(r *http.Request) error { return fmt.Errorf("bad params %s", r.URL.RawQuery) }},
		{"a long value printed", "https://h.test?next=https://h.test/account/SESSION-0123456789", "SESSION-0123456789",
			func(r *http.Request) error { return fmt.Errorf("redirect to %s failed", r.URL.Query().Get("next")) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := errTextOf(t, tt.raw, tt.mk); strings.Contains(got, tt.secret) {
				t.Errorf("Error() shows the secret %q: %q", tt.secret, got)
			}
		})
	}
}

// A query too short to be told from the text's own words ("?url") leaves
// the text whole, with the URL shown redacted.
func TestErrorTextOfAShortQuery(t *testing.T) {
	got := errTextOf(t, "https://api.test/v1/items?url", func(r *http.Request) error {
		return fmt.Errorf("%s %s giving up: %w", r.Method, r.URL, syscall.ECONNRESET)
	})
	if !strings.Contains(got, "GET https://api.test/v1/items giving up") {
		t.Errorf("Error() = %q; want the redacted URL in the text, whole", got)
	}
}

// TestErrorTextHasOnePrefix checks that an *Error says "retryhttp:" once,
// whatever its cause: a cause of this package's own keeps its prefix when
// printed alone, not inside the Error's text.
func TestErrorTextHasOnePrefix(t *testing.T) {
	refused := func(r *http.Request) (*http.Response, error) {
		return nil, CheckProxyConnect(r.Context(), r.URL, r, &http.Response{StatusCode: 403, Status: "403 Forbidden"})
	}
	inner := &Transport{Base: rht.NewTransport(rht.Status(503).Times(10)), Policy: Policy{MaxAttempts: 2, Rand: lowRand}}
	for _, tc := range []struct {
		name     string
		tr       *Transport
		prime    bool          // send a first request, answered 429, that starts the Limiter
		within   time.Duration // the request's deadline, if not 0
		cancelAt time.Duration // when the request is canceled, if not 0
	}{
		{name: "attempts exhausted on attempt timeouts", tr: &Transport{Base: rht.NewTransport(rht.Hang()),
			Policy: Policy{AttemptTimeout: 500 * time.Millisecond, Rand: lowRand}}},
		{name: "a base that returns neither a response nor an error",
			tr: &Transport{Base: roundTripperFunc(func(*http.Request) (*http.Response, error) { return nil, nil })}},
		{name: "a proxy's refusal", tr: &Transport{Base: roundTripperFunc(refused), Policy: Policy{Rand: lowRand}}},
		{name: "no send permit", tr: &Transport{Base: rht.NewTransport(rht.Status(429), rht.Status(200)), Limiter: &RateLimiter{},
			Policy: Policy{MaxAttempts: 1}}, prime: true, within: 5 * time.Millisecond},
		{name: "a Transport over a Transport", tr: &Transport{Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			resp, err := inner.RoundTrip(r)
			if err == nil {
				resp.Body.Close()
				return nil, fmt.Errorf("wrapped: %w", &Error{Report: Report{Attempts: 2, Decision: StopAttempts, Err: ErrAttemptTimeout}})
			}
			return nil, err
		}), Policy: Policy{MaxAttempts: 1}}},
		{name: "canceled in a wait after an attempt timeout", tr: &Transport{Base: rht.NewTransport(rht.Hang()),
			Policy: Policy{AttemptTimeout: 10 * time.Millisecond, Rand: highRand}}, cancelAt: 30 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				if tc.prime {
					roundTrip(t, tc.tr, newReq(t, "GET", ""))
				}
				ctx := context.Background()
				if tc.within > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.within)
					defer cancel()
				}
				if tc.cancelAt > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithCancel(ctx)
					defer cancel()
					time.AfterFunc(tc.cancelAt, cancel)
				}
				resp, err := tc.tr.RoundTrip(newReq(t, "GET", "").WithContext(ctx))
				if err == nil {
					resp.Body.Close()
					t.Fatal("got a response; want an error")
				}
				if n := strings.Count(err.Error(), "retryhttp:"); n != 1 {
					t.Errorf("got %q: %d prefixes; want 1", err, n)
				}
			})
		})
	}
}
