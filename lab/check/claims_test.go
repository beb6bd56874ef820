package check

// Tests of what the docs say the library does, where neither a snippet nor
// a saved run can show it. Each quotes the sentence it keeps true.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp"
	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// docs/guide-http-client.md: "When `http.Client.Timeout` fires, net/http
// may replace the error with one of its own that keeps the message and
// loses the type, so `errors.As` finds no `*retryhttp.Error`. The Report
// has the decision either way, and `err.(net.Error).Timeout()` is true.
// With a deadline on the request's context, or `Policy.Timeout`, the
// error is the Transport's."
func TestClientTimeoutMayReplaceTheError(t *testing.T) {
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(hang)
	const requests = 40
	const timeout = 50 * time.Millisecond

	// run sends the requests at once, each with a Report, and returns how
	// many errors held a *retryhttp.Error.
	run := func(t *testing.T, client *http.Client, ctxTimeout time.Duration) (kept int) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		for range requests {
			wg.Go(func() {
				ctx := context.Background()
				if ctxTimeout > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, ctxTimeout)
					defer cancel()
				}
				var rep retryhttp.Report
				req, _ := http.NewRequestWithContext(retryhttp.WithReport(ctx, &rep), "GET", srv.URL, nil)
				resp, err := client.Do(req)
				if err == nil {
					resp.Body.Close()
					t.Errorf("got a response from a server that hangs; want an error")
					return
				}
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Errorf("got %v; want an error whose Timeout() is true", err)
				}
				// Canceled; or done, when the base answered the client's
				// cancellation (Request.Cancel) before the context's
				// deadline with "net/http: request canceled", which is not
				// retryable.
				if rep.Decision != retryhttp.StopCanceled && rep.Decision != retryhttp.Done {
					t.Errorf("got Report.Decision %v; want %v (or %v)", rep.Decision, retryhttp.StopCanceled, retryhttp.Done)
				}
				var re *retryhttp.Error
				if errors.As(err, &re) {
					if re.Decision != rep.Decision {
						t.Errorf("got Error.Decision %v, Report.Decision %v; want them equal", re.Decision, rep.Decision)
					}
					mu.Lock()
					kept++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return kept
	}
	t.Run("Client.Timeout", func(t *testing.T) {
		client := &http.Client{Transport: &retryhttp.Transport{}, Timeout: timeout}
		kept := run(t, client, 0)
		t.Logf("%d of %d errors held the *retryhttp.Error", kept, requests)
	})
	t.Run("context deadline", func(t *testing.T) {
		client := &http.Client{Transport: &retryhttp.Transport{}}
		if kept := run(t, client, timeout); kept != requests {
			t.Errorf("got %d of %d errors holding the *retryhttp.Error; want all", kept, requests)
		}
	})
	t.Run("Policy.Timeout", func(t *testing.T) {
		client := &http.Client{Transport: &retryhttp.Transport{Policy: retryhttp.Policy{Timeout: timeout}}}
		if kept := run(t, client, 0); kept != requests {
			t.Errorf("got %d of %d errors holding the *retryhttp.Error; want all", kept, requests)
		}
	})
	// The replacement, made certain: the Transport's error comes back
	// after the client's timer has fired.
	t.Run("Client.Timeout, timer first", func(t *testing.T) {
		late := roundTripper(func(r *http.Request) (*http.Response, error) {
			<-r.Context().Done()
			time.Sleep(20 * time.Millisecond)
			return nil, r.Context().Err()
		})
		client := &http.Client{Transport: &retryhttp.Transport{Base: late}, Timeout: timeout}
		var rep retryhttp.Report
		req, _ := http.NewRequestWithContext(retryhttp.WithReport(context.Background(), &rep), "GET", "http://hang.test/", nil)
		_, err := client.Do(req)
		var re *retryhttp.Error
		if errors.As(err, &re) {
			t.Errorf("got %v holding the *retryhttp.Error; want net/http's replacement", err)
		}
		if !strings.Contains(err.Error(), "Client.Timeout exceeded") {
			t.Errorf("got %q; want net/http's Client.Timeout message", err)
		}
		if rep.Decision != retryhttp.StopCanceled {
			t.Errorf("got Report.Decision %v; want %v", rep.Decision, retryhttp.StopCanceled)
		}
	})
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// docs/throttling.md: "`MaxWait`, if set, bounds every wait for a permit,
// whether the request has a deadline or not: an attempt whose permit is
// further away fails with `ErrRateLimited`."
func TestMaxWaitBoundsEveryWait(t *testing.T) {
	for _, deadline := range []time.Duration{0, time.Hour} {
		for _, maxWait := range []time.Duration{0, time.Millisecond} {
			t.Run(fmt.Sprintf("deadline %v, MaxWait %v", deadline, maxWait), func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					throttled := true
					base := roundTripper(func(r *http.Request) (*http.Response, error) {
						code := http.StatusOK
						if throttled {
							code, throttled = http.StatusTooManyRequests, false
						}
						return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
					})
					lim := &retryhttp.RateLimiter{MaxWait: maxWait}
					tr := &retryhttp.Transport{Base: base, Limiter: lim, Policy: retryhttp.Policy{MaxAttempts: 1}}
					send := func() (time.Duration, error) {
						ctx := context.Background()
						if deadline > 0 {
							var cancel context.CancelFunc
							ctx, cancel = context.WithTimeout(ctx, deadline)
							defer cancel()
						}
						start := time.Now()
						req, _ := http.NewRequestWithContext(ctx, "GET", "http://throttled.test/", nil)
						resp, err := tr.RoundTrip(req)
						if err == nil {
							resp.Body.Close()
						}
						return time.Since(start), err
					}
					if _, err := send(); err != nil { // the 429 that starts the limiting
						t.Fatal(err)
					}
					waited, err := send() // its permit is one interval of the cut rate away
					switch {
					case maxWait == 0 && (err != nil || waited == 0):
						t.Errorf("got %v after %v; want a wait for the permit, then the response", err, waited)
					case maxWait > 0 && (!errors.Is(err, retryhttp.ErrRateLimited) || waited != 0):
						t.Errorf("got %v after %v; want ErrRateLimited at once: the permit is more than MaxWait away", err, waited)
					}
				})
			})
		}
	}
}

// docs/design.md §15, Defaults: a server-requested delay is "waited, plus up to 10%
// or `BaseDelay`, whichever is more".
func TestServerDelaySpread(t *testing.T) {
	top := func(n int64) int64 { return n - 1 } // the top of the spread
	for _, tt := range []struct {
		retryAfter string
		want       time.Duration
	}{
		{"0", 50 * time.Millisecond},              // BaseDelay (50ms by default) is more
		{"1", time.Second + 100*time.Millisecond}, // 10% is more
		{"2", 2*time.Second + 200*time.Millisecond},
	} {
		t.Run("Retry-After "+tt.retryAfter, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				first := true
				var gap time.Duration
				var last time.Time
				base := roundTripper(func(r *http.Request) (*http.Response, error) {
					resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{}, Body: http.NoBody, Request: r}
					if first {
						first, last = false, time.Now()
						resp.StatusCode = http.StatusServiceUnavailable
						resp.Header.Set("Retry-After", tt.retryAfter)
					} else {
						gap = time.Since(last)
					}
					return resp, nil
				})
				tr := &retryhttp.Transport{Base: base, Policy: retryhttp.Policy{Rand: top}}
				req, _ := http.NewRequest("GET", "http://api.test/", nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if want := tt.want; gap != want {
					t.Errorf("got a wait of %v; want %v", gap, want)
				}
			})
		})
	}
}

// docs/guide-metrics.md, log/slog: the fields its "Fields:" paragraph
// names in code spans are exactly those the Transport logs.
func TestLogFields(t *testing.T) {
	guide, err := Load(root + "/docs/guide-metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	var para strings.Builder
	for _, l := range guide.Lines {
		if strings.HasPrefix(l, "Fields:") || para.Len() > 0 {
			if strings.TrimSpace(l) == "" {
				break
			}
			para.WriteString(l + " ")
		}
	}
	want := map[string]bool{}
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(para.String(), -1) {
		want[m[1]] = true
	}
	if len(want) == 0 {
		t.Fatal(`no "Fields:" paragraph with field names in code spans in docs/guide-metrics.md`)
	}

	got := map[string]bool{}
	var buf bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&buf, nil))
	synctest.Test(t, func(t *testing.T) {
		send := func(tr *retryhttp.Transport) {
			req, _ := http.NewRequest("GET", "http://api.test/", nil)
			if resp, err := tr.RoundTrip(req); err == nil {
				resp.Body.Close()
			}
		}
		// A retry after a 503, then a success; a network error given up.
		send(&retryhttp.Transport{Logger: logger, Base: rht.NewTransport(rht.Status(503), rht.Status(200))})
		send(&retryhttp.Transport{Logger: logger, Policy: retryhttp.Policy{MaxAttempts: 1},
			Base: rht.NewTransport(rht.Step{Err: syscall.ECONNREFUSED})})
		// A budget paying from its fallback (as redisbudget's does).
		send(&retryhttp.Transport{Logger: logger, Budget: fallingBack{retryhttp.NewTokenBucket(500)},
			Base: rht.NewTransport(rht.Status(503), rht.Status(200))})
		// A Limiter: a 429 starts the limiting, and the retries after it
		// wait for their permits; a request with too short a deadline gets
		// none.
		lim := &retryhttp.RateLimiter{}
		limited := &retryhttp.Transport{Logger: logger, Limiter: lim, Base: rht.NewTransport(rht.Status(429), rht.Status(503), rht.Status(200))}
		// A request right after a 429 waits for its permit, and its 503 is
		// logged with the wait (a retry's backoff may outlast the wait).
		waiting := &retryhttp.RateLimiter{}
		send(&retryhttp.Transport{Logger: logger, Limiter: waiting, Policy: retryhttp.Policy{MaxAttempts: 1}, Base: rht.NewTransport(rht.Status(429))})
		send(&retryhttp.Transport{Logger: logger, Limiter: waiting, Base: rht.NewTransport(rht.Status(503), rht.Status(200))})
		send(limited)
		send(limited)
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://api.test/", nil)
		if resp, err := limited.RoundTrip(req); err == nil {
			resp.Body.Close()
		}
	})
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatal(err)
		}
		for k := range m {
			switch k {
			case "time", "level", "msg":
			default:
				got[k] = true
			}
		}
	}
	for k := range got {
		if !want[k] {
			t.Errorf("the Transport logs %q; the guide's Fields paragraph does not name it", k)
		}
	}
	for k := range want {
		if !got[k] {
			t.Errorf("the guide names %q; the Transport did not log it", k)
		}
	}
}

// fallingBack is a budget that reports paying from its fallback.
type fallingBack struct{ retryhttp.Budget }

func (fallingBack) Fallback() (bool, error) { return true, nil }

// docs/releasing.md, Before the first release: "`go mod tidy` then works: it reads the library from
// the checkout, records that placeholder version ... A workspace ... builds
// without touching your `go.mod`, but `go mod tidy` ignores workspaces and
// fails as above, and so does any build with `GOWORK=off` ...; in workspace
// mode the go command also refuses `GOFLAGS=-mod=mod`". Offline: the
// library's dependencies come from the module cache (their checksums too:
// the checksum database is a network service, not what is tested here),
// and a lookup of the library itself fails as it does on the proxy before
// a release.
func TestInstallBeforeARelease(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go command")
	}
	checkout, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	goCmd := func(dir string, env []string, args ...string) (string, error) {
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), append([]string{"GOPROXY=off", "GOSUMDB=off"}, env...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	app := func(t *testing.T, dir string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		main := "package main\n\nimport (\n\t\"net/http\"\n\n\t\"github.com/herdproof/retryhttp\"\n)\n\nfunc main() { _ = &http.Client{Transport: &retryhttp.Transport{}} }\n"
		if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(main), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := goCmd(dir, []string{"GOWORK=off"}, "mod", "init", "example.com/app"); err != nil {
			t.Fatalf("go mod init: %v\n%s", err, out)
		}
	}
	t.Run("replace", func(t *testing.T) {
		dir := t.TempDir()
		app(t, dir)
		if out, err := goCmd(dir, []string{"GOWORK=off"}, "mod", "tidy"); err == nil {
			t.Errorf("go mod tidy without a replace: got no error; want one (the module is not published)\n%s", out)
		}
		for _, args := range [][]string{
			{"mod", "edit", "-replace", "github.com/herdproof/retryhttp=" + checkout},
			{"mod", "tidy"},
			{"build", "."},
		} {
			if out, err := goCmd(dir, []string{"GOWORK=off"}, args...); err != nil {
				t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
			}
		}
		mod, _ := os.ReadFile(filepath.Join(dir, "go.mod"))
		if !strings.Contains(string(mod), "github.com/herdproof/retryhttp v0.0.0-00010101000000-000000000000") {
			t.Errorf("go.mod after tidy:\n%s\nwant the placeholder version required", mod)
		}
	})
	t.Run("workspace", func(t *testing.T) {
		dir := t.TempDir()
		app(t, filepath.Join(dir, "app"))
		if out, err := goCmd(dir, []string{"GOWORK="}, "work", "init", "./app", checkout); err != nil {
			t.Fatalf("go work init: %v\n%s", err, out)
		}
		appDir := filepath.Join(dir, "app")
		if out, err := goCmd(appDir, []string{"GOWORK=" + filepath.Join(dir, "go.work")}, "build", "."); err != nil {
			t.Fatalf("go build in the workspace: %v\n%s", err, out)
		}
		if out, err := goCmd(appDir, []string{"GOWORK=" + filepath.Join(dir, "go.work")}, "mod", "tidy"); err == nil {
			t.Errorf("go mod tidy in the workspace: got no error; want one (tidy ignores go.work)\n%s", out)
		}
		if out, err := goCmd(appDir, []string{"GOWORK=off"}, "build", "."); err == nil {
			t.Errorf("GOWORK=off go build: got no error; want one\n%s", out)
		}
		if out, err := goCmd(appDir, []string{"GOWORK=" + filepath.Join(dir, "go.work"), "GOFLAGS=-mod=mod"}, "build", "."); err == nil {
			t.Errorf("GOFLAGS=-mod=mod go build in the workspace: got no error; want one\n%s", out)
		}
	})
}
