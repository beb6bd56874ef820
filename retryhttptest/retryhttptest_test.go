package retryhttptest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
)

func get(t *testing.T, rt http.RoundTripper, method, url, key string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader("body"))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	return rt.RoundTrip(req)
}

func TestScript(t *testing.T) {
	tests := []struct {
		name  string
		steps []Step
		want  []int
	}{
		{"empty answers 200", nil, []int{200, 200}},
		{"twice then 200", []Step{Status(503).Times(2), Status(200)}, []int{503, 503, 200, 200}},
		{"last step repeats", []Step{Status(429), Status(500)}, []int{429, 500, 500}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTransport(tc.steps...)
			var got []int
			for range tc.want {
				resp, err := get(t, tr, "GET", "http://x.test/", "")
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				got = append(got, resp.StatusCode)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("got %v; want %v", got, tc.want)
			}
		})
	}
}

func TestTransportSteps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		boom := errors.New("boom")
		tr := NewTransport(Reset(), CommitThenDrop(), Step{Err: boom}, Status(200).WithBody("ok").WithHeader("X-A", "1"), Step{Delay: time.Second})
		if _, err := get(t, tr, "POST", "http://x.test/a", "k"); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("Reset: got %v; want ECONNRESET", err)
		}
		if tr.Effects() != 0 {
			t.Errorf("Reset: got %d effects; want 0", tr.Effects())
		}
		if _, err := get(t, tr, "POST", "http://x.test/a", "k"); !errors.Is(err, syscall.ECONNRESET) {
			t.Errorf("CommitThenDrop: got %v; want ECONNRESET", err)
		}
		if _, err := get(t, tr, "POST", "http://x.test/a", "k"); err != boom {
			t.Errorf("Err: got %v; want boom", err)
		}
		resp, err := get(t, tr, "POST", "http://x.test/a", "k")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		if string(b) != "ok" || resp.Header.Get("X-A") != "1" {
			t.Errorf("got (%q, %v); want (ok, X-A: 1)", b, resp.Header)
		}
		if tr.OpenBodies() != 1 {
			t.Errorf("got %d open bodies; want 1", tr.OpenBodies())
		}
		resp.Body.Close()
		if tr.OpenBodies() != 0 {
			t.Errorf("got %d open bodies after Close; want 0", tr.OpenBodies())
		}
		if tr.Effects() != 1 {
			t.Errorf("got %d effects for one key; want 1", tr.Effects())
		}
		start := time.Now()
		resp, err = get(t, tr, "GET", "http://x.test/", "")
		if err != nil || time.Since(start) != time.Second {
			t.Errorf("Delay: got %v after %v; want a response after 1s", err, time.Since(start))
		}
		resp.Body.Close()
		as := tr.Attempts()
		if len(as) != 5 || as[0].Method != "POST" || as[0].Path != "/a" || as[0].Body != "body" || as[0].Key != "k" {
			t.Errorf("got attempts %+v; want 5, the first a POST /a with body and key", as)
		}
		if g := Gaps(tr); len(g) != 4 || g[3] != 0 {
			t.Errorf("got gaps %v; want 4, the last 0 (a Delay comes after the attempt is recorded)", g)
		}
	})
}

func TestTransportHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := NewTransport(Hang())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://x.test/", nil)
		start := time.Now()
		if _, err := tr.RoundTrip(req); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Minute {
			t.Errorf("got %v after %v; want DeadlineExceeded after 1m", err, time.Since(start))
		}
	})
}

func TestServer(t *testing.T) {
	srv := NewServer(t, Reset(), CommitThenDrop(), Status(503).WithHeader("Retry-After", "2"), Status(201).WithBody("made"))
	client := &http.Transport{}
	defer client.CloseIdleConnections()
	if _, err := get(t, client, "POST", srv.URL+"/w", "k1"); err == nil {
		t.Error("Reset: got a response; want an error")
	}
	if _, err := get(t, client, "POST", srv.URL+"/w", "k1"); err == nil {
		t.Error("CommitThenDrop: got a response; want an error")
	}
	resp, err := get(t, client, "POST", srv.URL+"/w", "k1")
	if err != nil || resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "2" {
		t.Fatalf("got (%v, %v); want 503 with Retry-After: 2", resp, err)
	}
	resp.Body.Close()
	resp, err = get(t, client, "POST", srv.URL+"/w", "k1")
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("got (%v, %v); want 201", resp, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "made" {
		t.Errorf("got body %q; want made", b)
	}
	AssertAttempts(t, srv, 4)
	AssertStableKey(t, srv)
	if srv.Effects() != 1 {
		t.Errorf("got %d effects; want 1 (one key)", srv.Effects())
	}
	if _, err := get(t, client, "POST", srv.URL+"/w", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := get(t, client, "POST", srv.URL+"/w", ""); err != nil {
		t.Fatal(err)
	}
	if srv.Effects() != 3 {
		t.Errorf("got %d effects; want 3 (writes without a key are not deduplicated)", srv.Effects())
	}
	if srv.Conns() < 3 {
		t.Errorf("got %d connections; want at least 3 (two were cut)", srv.Conns())
	}
}

func TestServerHangReleasedByClose(t *testing.T) {
	srv := NewServer(t, Hang())
	errc := make(chan error, 1)
	go func() {
		_, err := http.Get(srv.URL)
		errc <- err
	}()
	for len(srv.Attempts()) == 0 {
		time.Sleep(time.Millisecond)
	}
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close blocked on a hanging handler")
	}
	<-errc
}

// fakeTB records what the assertion helpers report.
type fakeTB struct {
	testing.TB
	errors []string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Errorf(format string, args ...any) {
	f.errors = append(f.errors, fmt.Sprintf(format, args...))
}
func (f *fakeTB) Error(args ...any) { f.errors = append(f.errors, fmt.Sprint(args...)) }

type fixed []Attempt

func (f fixed) Attempts() []Attempt { return f }

func TestAssertions(t *testing.T) {
	tests := []struct {
		name     string
		rec      fixed
		attempts int
		okCount  bool
		okKey    bool
	}{
		{"stable", fixed{{Key: "a"}, {Key: "a"}}, 2, true, true},
		{"changed key", fixed{{Key: "a"}, {Key: "b"}}, 2, true, false},
		{"no key", fixed{{}, {}}, 2, true, false},
		{"wrong count", fixed{{Key: "a"}}, 2, false, true},
		{"nothing", fixed{}, 0, true, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeTB{}
			if got := AssertAttempts(f, tc.rec, tc.attempts); got != tc.okCount {
				t.Errorf("AssertAttempts: got %v; want %v", got, tc.okCount)
			}
			if got := AssertStableKey(f, tc.rec); got != tc.okKey {
				t.Errorf("AssertStableKey: got %v; want %v", got, tc.okKey)
			}
			wantErrs := 0
			if !tc.okCount {
				wantErrs++
			}
			if !tc.okKey {
				wantErrs++
			}
			if len(f.errors) != wantErrs {
				t.Errorf("got %d reported errors %q; want %d", len(f.errors), f.errors, wantErrs)
			}
		})
	}
}

func TestKeyHeader(t *testing.T) {
	const name = "Amz-Sdk-Invocation-Id"
	post := func(t *testing.T, rt http.RoundTripper, url string) {
		t.Helper()
		req, _ := http.NewRequest("POST", url, strings.NewReader("x"))
		req.Header.Set(name, "inv-1")
		req.Header.Set(KeyHeader, "other")
		resp, err := rt.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	t.Run("Transport", func(t *testing.T) {
		tr := &Transport{KeyHeader: name}
		post(t, tr, "http://x.test/")
		post(t, tr, "http://x.test/")
		if got := Keys(tr); len(got) != 2 || got[0] != "inv-1" {
			t.Errorf("got keys %q; want [inv-1 inv-1]", got)
		}
		if tr.Effects() != 1 {
			t.Errorf("got %d effects; want 1 (deduplicated by %s)", tr.Effects(), name)
		}
	})
	t.Run("Server", func(t *testing.T) {
		srv := NewUnstartedServer(t)
		srv.KeyHeader = name
		srv.Start()
		client := &http.Transport{}
		defer client.CloseIdleConnections()
		post(t, client, srv.URL)
		post(t, client, srv.URL)
		AssertStableKey(t, srv)
		if got := srv.Attempts()[0].Key; got != "inv-1" {
			t.Errorf("got key %q; want inv-1", got)
		}
		if srv.Effects() != 1 {
			t.Errorf("got %d effects; want 1", srv.Effects())
		}
	})
}

func TestTimesZeroLeavesTheStepOut(t *testing.T) {
	tr := NewTransport(Status(503).Times(0), Status(429).Times(-1), Status(201))
	resp, err := get(t, tr, "GET", "http://x.test/", "")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Errorf("got %d; want 201 (the steps repeated zero times are left out)", resp.StatusCode)
	}
}

func TestWithDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := NewTransport(Status(200).WithDelay(3 * time.Second))
		start := time.Now()
		resp, err := get(t, tr, "GET", "http://x.test/", "")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got := time.Since(start); got != 3*time.Second {
			t.Errorf("got the answer after %v; want 3s", got)
		}
	})
}

// fatalRecorder records Fatalf instead of stopping the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (f *fatalRecorder) Fatalf(format string, args ...any) { f.msg = fmt.Sprintf(format, args...) }
func (f *fatalRecorder) Helper()                           {}

func TestServerRefusesStepErr(t *testing.T) {
	rec := &fatalRecorder{TB: t}
	if srv := NewServer(rec, Step{Err: errors.New("boom")}); srv != nil {
		t.Error("got a Server; want none")
	}
	if !strings.Contains(rec.msg, "Step 1 sets Err") && !strings.Contains(rec.msg, "step 1 sets Err") {
		t.Errorf("got %q; want the test failed for step 1's Err", rec.msg)
	}
}

// A step that is still waiting (Hang, or a Delay) when the Server closes
// must not answer: "Hang never answers", and a delayed 503 is a 503. The
// handler returned normally on close, and net/http then sent an implicit
// 200 OK with an empty body to the client still waiting.
func TestCloseReleasesWithoutAnswering(t *testing.T) {
	for _, tc := range []struct {
		name string
		step Step
	}{
		{"Hang", Hang()},
		{"503 after a delay", Status(503).WithDelay(time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := NewServer(t, tc.step)
			type result struct {
				code int
				err  error
			}
			done := make(chan result, 1)
			go func() {
				resp, err := http.Get(srv.URL)
				if err != nil {
					done <- result{0, err}
					return
				}
				resp.Body.Close()
				done <- result{resp.StatusCode, nil}
			}()
			for len(srv.Attempts()) == 0 {
				time.Sleep(time.Millisecond)
			}
			srv.Close()
			r := <-done
			if r.err == nil {
				t.Errorf("got a %d response after Close; want no answer (an error)", r.code)
			}
		})
	}
}

// Reset is documented as a TCP reset; under StartTLS the hijacked conn is a
// *tls.Conn, SetLinger(0) is skipped, and the client sees an orderly close.
func TestResetIsAResetUnderTLS(t *testing.T) {
	srv := NewUnstartedServer(t, Reset())
	srv.StartTLS()
	tr := srv.Client().Transport.(*http.Transport).Clone()
	req, _ := http.NewRequest("POST", srv.URL, strings.NewReader("x"))
	_, err := (&http.Client{Transport: tr}).Do(req)
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("got %v; want an error wrapping ECONNRESET (a TCP reset)", err)
	}
}

// AssertStableKey's message when the first attempt has no key read
// `attempt 1: got key ""; want "", the key of attempt 1`: it wants what it
// got. It must say that the key is missing.
func TestAssertStableKeyMessageOnMissingKey(t *testing.T) {
	tr := NewTransport()
	for range 2 {
		req, _ := http.NewRequest("POST", "http://api.test/", nil)
		resp, _ := tr.RoundTrip(req)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	f := &fakeTB{}
	if AssertStableKey(f, tr) {
		t.Fatal("got true for attempts with no key; want false")
	}
	if len(f.errors) != 1 || strings.Contains(f.errors[0], `got key ""; want ""`) {
		t.Errorf("got message %q; want one that says the key is missing, not that \"\" is wanted", f.errors)
	}
}
