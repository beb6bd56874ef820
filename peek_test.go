package retryhttp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestPeekBody(t *testing.T) {
	tests := []struct {
		name, body string
		n          int
		want       string
	}{
		{"prefix of a long body", "ThrottlingException: slow down", 10, "Throttling"},
		{"body shorter than n", "short", 100, "short"},
		{"empty", "", 10, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			closed := false
			resp := &http.Response{Body: readCloser{strings.NewReader(tc.body), func() { closed = true }}}
			got, err := PeekBody(resp, tc.n)
			if err != nil || string(got) != tc.want {
				t.Fatalf("got (%q, %v); want (%q, nil)", got, err, tc.want)
			}
			all, _ := io.ReadAll(resp.Body)
			if string(all) != tc.body {
				t.Errorf("after the peek the body reads %q; want it whole, %q", all, tc.body)
			}
			resp.Body.Close()
			if !closed {
				t.Error("closing the peeked body did not close the original")
			}
		})
	}
	t.Run("read error keeps what was read", func(t *testing.T) {
		boom := errors.New("boom")
		resp := &http.Response{Body: readCloser{io.MultiReader(strings.NewReader("abc"), errReader{boom}), func() {}}}
		got, err := PeekBody(resp, 10)
		if !errors.Is(err, boom) || string(got) != "abc" {
			t.Errorf("got (%q, %v); want (abc, boom)", got, err)
		}
	})
	t.Run("no body", func(t *testing.T) {
		if got, err := PeekBody(&http.Response{Body: http.NoBody}, 10); got != nil || err != nil {
			t.Errorf("got (%q, %v); want (nil, nil)", got, err)
		}
	})
}

type readCloser struct {
	io.Reader
	close func()
}

func (r readCloser) Close() error { r.close(); return nil }

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestPeekBodyOnAStalledBodyIsCutByAttemptTimeout(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) > 1 {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", "1000")
		w.WriteHeader(400)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	classify := func(resp *http.Response, err error) Class {
		if resp != nil && resp.StatusCode == 400 {
			if b, _ := PeekBody(resp, 64); strings.Contains(string(b), "Throttling") {
				return Throttling
			}
		}
		return DefaultClassify(resp, err)
	}
	tr := &Transport{Policy: Policy{BaseDelay: time.Millisecond, AttemptTimeout: 200 * time.Millisecond, Classify: classify}}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	code, _, err := roundTrip(t, tr, mustReq(t, "GET", srv.URL).WithContext(ctx))
	if err != nil || code != 200 {
		t.Fatalf("got (%d, %v); want 200 after the stalled peek timed out", code, err)
	}
}

// truncatingServer answers every request with a status, a Content-Length
// of declared and only the bytes of body, then closes the connection.
func truncatingServer(t *testing.T, status int, body string, declared int) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer conn.Close()
		fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n%s", status, http.StatusText(status), declared, body)
		buf.Flush()
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestPeekBodyLargerThanTheBody(t *testing.T) {
	// n far beyond the body (math.MaxInt for "all of it"): the body's few
	// bytes, nothing allocated for the rest.
	const body = `{"__type":"ThrottlingException"}`
	resp := &http.Response{StatusCode: 400, Body: io.NopCloser(strings.NewReader(body))}
	got, err := PeekBody(resp, math.MaxInt)
	if err != nil || string(got) != body {
		t.Errorf("got %q, %v; want %q, nil", got, err, body)
	}
	if rest, _ := io.ReadAll(resp.Body); string(rest) != body {
		t.Errorf("the body reads %q after the peek; want it whole, %q", rest, body)
	}
}

func TestPeekBodyKeepsTruncation(t *testing.T) {
	for _, n := range []int{8, 1024} {
		t.Run(fmt.Sprintf("peek %d", n), func(t *testing.T) {
			srv := truncatingServer(t, http.StatusBadRequest, "<Error><Code>x</Code>", 4096)
			resp, err := http.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if _, err := PeekBody(resp, n); err != nil {
				t.Logf("peek error: %v", err)
			}
			_, err = io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("reading a body cut short after PeekBody(%d): got error %v; want io.ErrUnexpectedEOF, as without the peek", n, err)
			}
		})
	}
}
