package retryhttp

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"
	"time"
)

func TestProxyFailuresBeforeTheOrigin(t *testing.T) {
	// A keyless POST may be retried when nothing reached the origin.
	t.Run("proxy refuses the connection", func(t *testing.T) {
		var effects atomic.Int32
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			effects.Add(1) // a plain-HTTP proxy forwards; this one answers itself
			io.WriteString(w, "ok")
		}))
		defer proxy.Close()
		down, _ := url.Parse(closedURL(t))
		up, _ := url.Parse(proxy.URL)
		var calls atomic.Int32
		base := &http.Transport{Proxy: func(*http.Request) (*url.URL, error) {
			if calls.Add(1) == 1 {
				return down, nil
			}
			return up, nil
		}}
		defer base.CloseIdleConnections()
		tr := &Transport{Base: base, Policy: Policy{BaseDelay: time.Millisecond, NewIdempotencyKey: noKey}}
		var rep Report
		req := mustReq(t, "POST", "http://origin.test/charge")
		req = req.WithContext(WithReport(req.Context(), &rep))
		code, _, err := roundTrip(t, tr, req)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200 through the proxy on the retry", code, err)
		}
		if len(rep.History) != 2 || effects.Load() != 1 {
			t.Errorf("got %d attempts and %d effects; want 2 and 1", len(rep.History), effects.Load())
		}
		if err := rep.History[0].Err; opError(err, "proxyconnect") == nil || !neverSent(err) {
			t.Errorf("first attempt: got %v; want a proxyconnect error that proves nothing was sent", err)
		}
	})
	t.Run("proxy answers CONNECT with 503", func(t *testing.T) {
		var origin atomic.Int32
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			origin.Add(1)
			io.WriteString(w, "ok")
		}))
		defer srv.Close()
		var connects atomic.Int32
		proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != http.MethodConnect {
				http.Error(w, "CONNECT only", http.StatusMethodNotAllowed)
				return
			}
			if connects.Add(1) == 1 {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			tunnel(w, r.Host)
		}))
		defer proxy.Close()
		proxyURL, _ := url.Parse(proxy.URL)
		base := srv.Client().Transport.(*http.Transport).Clone()
		base.Proxy = http.ProxyURL(proxyURL)
		base.OnProxyConnectResponse = CheckProxyConnect
		defer base.CloseIdleConnections()
		tr := &Transport{Base: base, Policy: Policy{BaseDelay: time.Millisecond, NewIdempotencyKey: noKey}}
		var rep Report
		req := mustReq(t, "POST", srv.URL)
		req = req.WithContext(WithReport(req.Context(), &rep))
		code, _, err := roundTrip(t, tr, req)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200 after the proxy's 503", code, err)
		}
		if connects.Load() != 2 || origin.Load() != 1 {
			t.Errorf("got %d CONNECTs and %d origin requests; want 2 and 1", connects.Load(), origin.Load())
		}
		var pe *proxyConnectError
		if first := rep.History[0]; !errors.As(first.Err, &pe) || pe.StatusCode != 503 || first.Class != Transient {
			t.Errorf("first attempt: got %v (%v); want a Transient *proxyConnectError with status 503", first.Err, first.Class)
		}
	})
	t.Run("CONNECT statuses", func(t *testing.T) {
		for code, want := range map[int]Class{502: Transient, 503: Transient, 504: Transient, 429: Throttling, 407: Permanent, 403: Permanent} {
			err := CheckProxyConnect(context.Background(), nil, nil, &http.Response{StatusCode: code, Status: http.StatusText(code)})
			if got := DefaultClassify(nil, err); got != want {
				t.Errorf("CONNECT %d: got %v; want %v", code, got, want)
			}
		}
		if err := CheckProxyConnect(context.Background(), nil, nil, &http.Response{StatusCode: 200}); err != nil {
			t.Errorf("CONNECT 200: got %v; want nil", err)
		}
	})
}

// tunnel answers a CONNECT by relaying bytes to addr.
func tunnel(w http.ResponseWriter, addr string) {
	dst, err := net.Dial("tcp", addr)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	src, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		dst.Close()
		return
	}
	go func() {
		io.Copy(dst, buf)
		dst.Close()
	}()
	io.Copy(src, dst)
	src.Close()
}
