package retryhttp

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
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
