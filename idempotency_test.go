package retryhttp

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/uuid"
	rht "github.com/herdproof/retryhttp/retryhttptest"
)

var errDial = &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}

func TestIdempotency(t *testing.T) {
	tests := []struct {
		name         string
		method       string
		header       http.Header // set on the caller's request
		policy       Policy
		script       []rht.Step
		wantAttempts int
		wantKey      string // "" none, "*" a generated one, else this exact value
		wantDecision Decision
	}{
		{"POST gets one generated key", "POST", nil, Policy{}, []rht.Step{rht.Status(503), rht.Status(200)}, 2, "*", Done},
		{"PATCH gets one generated key", "PATCH", nil, Policy{}, []rht.Step{rht.Status(503), rht.Status(200)}, 2, "*", Done},
		{"GET gets none", "GET", nil, Policy{}, []rht.Step{rht.Status(503), rht.Status(200)}, 2, "", Done},
		{"PUT gets none", "PUT", nil, Policy{}, []rht.Step{rht.Status(503), rht.Status(200)}, 2, "", Done},
		{"caller's key is kept verbatim", "POST", http.Header{"Idempotency-Key": {`"order-42"`}}, Policy{},
			[]rht.Step{rht.Status(503), rht.Status(200)}, 2, `"order-42"`, Done},
		{"custom header and generator", "POST", nil,
			Policy{IdempotencyHeader: "x-request-id", NewIdempotencyKey: func() string { return "fixed" }},
			[]rht.Step{rht.Status(503), rht.Status(200)}, 2, "", Done},
		{"keys off: POST not retried after a 503", "POST", nil, Policy{NewIdempotencyKey: noKey},
			[]rht.Step{rht.Status(503), rht.Status(200)}, 1, "", StopNotIdempotent},
		{"keys off: POST not retried after a reset", "POST", nil, Policy{NewIdempotencyKey: noKey},
			[]rht.Step{{Err: errReset}, rht.Status(200)}, 1, "", StopNotIdempotent},
		{"keys off: POST retried after a dial failure", "POST", nil, Policy{NewIdempotencyKey: noKey},
			[]rht.Step{{Err: errDial}, rht.Status(200)}, 2, "", Done},
		{"keys off: caller's key still allows retries", "POST", http.Header{"Idempotency-Key": {"k1"}},
			Policy{NewIdempotencyKey: noKey}, []rht.Step{rht.Status(503), rht.Status(200)}, 2, "k1", Done},
		{"one attempt: no key added", "POST", nil, Policy{MaxAttempts: 1}, []rht.Step{rht.Status(503)}, 1, "", Done},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.script...)
				var last Attempt
				tr := &Transport{Base: base, Policy: tc.policy, OnAttempt: func(a Attempt) { last = a }}
				req := newReq(t, tc.method, "body")
				for k, v := range tc.header {
					req.Header[k] = v
				}
				resp, err := tr.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
				} else if re := (*Error)(nil); !errors.As(err, &re) || re.Decision != tc.wantDecision {
					t.Errorf("got error %v; want a response or an *Error with %v", err, tc.wantDecision)
				}
				if n := len(base.Attempts()); n != tc.wantAttempts {
					t.Errorf("got %d attempts; want %d", n, tc.wantAttempts)
				}
				keys := rht.Keys(base)
				for i, k := range keys {
					switch {
					case tc.wantKey == "*" && (k == "" || k != keys[0]):
						t.Errorf("attempt %d: got key %q; want the same generated key as attempt 1 (%q)", i+1, k, keys[0])
					case tc.wantKey != "*" && k != tc.wantKey:
						t.Errorf("attempt %d: got key %q; want %q", i+1, k, tc.wantKey)
					}
				}
				if tc.policy.IdempotencyHeader != "" {
					for i, a := range base.Attempts() {
						if got := a.Header.Get(tc.policy.IdempotencyHeader); got != "fixed" {
							t.Errorf("attempt %d: got %s %q; want \"fixed\"", i+1, tc.policy.IdempotencyHeader, got)
						}
					}
				}
				if tc.policy.MaxAttempts != 1 && last.Decision != tc.wantDecision {
					t.Errorf("got final decision %v; want %v", last.Decision, tc.wantDecision)
				}
			})
		})
	}
}

func TestKeysDifferPerRoundTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(503), rht.Status(200), rht.Status(503), rht.Status(200))
		tr := &Transport{Base: base}
		roundTrip(t, tr, newReq(t, "POST", "a"))
		roundTrip(t, tr, newReq(t, "POST", "b"))
		k := rht.Keys(base)
		if k[0] != k[1] || k[2] != k[3] || k[0] == k[2] {
			t.Errorf("got keys %q; want one key per RoundTrip, shared by its attempts", k)
		}
	})
}

func TestNonCanonicalKeyHeader(t *testing.T) {
	// A caller who writes the map directly still has its key honoured, and no
	// second key is added beside it.
	synctest.Test(t, func(t *testing.T) {
		base := rht.NewTransport(rht.Status(503), rht.Status(200))
		tr := &Transport{Base: base}
		req := newReq(t, "POST", "x")
		req.Header["idempotency-key"] = []string{"mine"}
		roundTrip(t, tr, req)
		as := base.Attempts()
		if len(as) != 2 {
			t.Fatalf("got %d attempts; want 2", len(as))
		}
		for i, a := range as {
			//lint:ignore SA1008 reading the caller's non-canonical spelling is the point
			if got := a.Header["idempotency-key"]; len(got) != 1 || got[0] != "mine" {
				t.Errorf("attempt %d: got %q under the caller's spelling; want [mine]", i+1, got)
			}
			if got := a.Header[defaultIdempotencyHeader]; got != nil {
				t.Errorf("attempt %d: got a second key %q; want none", i+1, got)
			}
		}
	})
}

func TestBodies(t *testing.T) {
	t.Run("a body without GetBody is not replayed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Status(503), rht.Status(200))
			var last Attempt
			tr := &Transport{Base: base, OnAttempt: func(a Attempt) { last = a }}
			req := newReq(t, "PUT", "")
			req.Body = io.NopCloser(strings.NewReader("stream"))
			code, _, err := roundTrip(t, tr, req)
			if err != nil || code != 503 || len(base.Attempts()) != 1 || last.Decision != StopNotReplayable {
				t.Errorf("got (%d, %v, %d attempts, %v); want (503, nil, 1, %v)", code, err, len(base.Attempts()), last.Decision, StopNotReplayable)
			}
		})
	})
	t.Run("GetBody failing on the retry returns the last response", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Status(503), rht.Status(200))
			tr := &Transport{Base: base}
			req := newReq(t, "PUT", "x")
			req.GetBody = func() (io.ReadCloser, error) { return nil, errors.New("gone") }
			code, _, err := roundTrip(t, tr, req)
			if err != nil || code != 503 || len(base.Attempts()) != 1 {
				t.Errorf("got (%d, %v, %d attempts); want (503, nil, 1)", code, err, len(base.Attempts()))
			}
			if got := tr.budgetInUse().Available(); got != DefaultBudgetTokens {
				t.Errorf("got %d tokens; want %d (an unsent retry costs nothing)", got, DefaultBudgetTokens)
			}
		})
	})
	t.Run("every request body is closed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			base := rht.NewTransport(rht.Status(503), rht.Step{Err: errReset}, rht.Status(200))
			tr := &Transport{Base: base}
			var mu sync.Mutex
			var bodies []*closeCounter
			mk := func() (io.ReadCloser, error) {
				mu.Lock()
				defer mu.Unlock()
				b := &closeCounter{Reader: bytes.NewReader([]byte("data"))}
				bodies = append(bodies, b)
				return b, nil
			}
			req := newReq(t, "POST", "")
			req.Body, _ = mk()
			req.GetBody = mk
			roundTrip(t, tr, req)
			if len(bodies) != 3 {
				t.Fatalf("got %d bodies; want 3 (one per attempt)", len(bodies))
			}
			for i, b := range bodies {
				if b.closes != 1 {
					t.Errorf("body %d: got %d closes; want 1", i, b.closes)
				}
			}
		})
	})
}

func TestCallerRequestUntouched(t *testing.T) {
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name   string
		method string
		policy Policy
		script []rht.Step
		setup  func(*http.Request) *http.Request
	}{
		{"GET success", "GET", Policy{}, []rht.Step{rht.Status(200)}, nil},
		{"GET retried", "GET", Policy{}, []rht.Step{rht.Status(503), rht.Status(200)}, nil},
		{"POST, generated key, both timeouts", "POST", Policy{Timeout: time.Minute, AttemptTimeout: time.Second},
			[]rht.Step{rht.Status(503), rht.Hang(), rht.Status(200)}, nil},
		{"POST, caller's key", "POST", Policy{}, []rht.Step{rht.Status(503), rht.Status(200)},
			func(r *http.Request) *http.Request { r.Header.Set("Idempotency-Key", "k"); return r }},
		{"POST, non-canonical key", "POST", Policy{}, []rht.Step{rht.Status(503), rht.Status(200)},
			func(r *http.Request) *http.Request {
				r.Header["idempotency-key"] = []string{"k"}
				return r
			}},
		{"PUT, body not replayable", "PUT", Policy{}, []rht.Step{rht.Status(503)},
			func(r *http.Request) *http.Request { r.GetBody = nil; return r }},
		{"cancelled context", "POST", Policy{}, nil,
			func(r *http.Request) *http.Request { return r.WithContext(cancelled) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tr := &Transport{Base: rht.NewTransport(tc.script...), Policy: tc.policy}
				req := newReq(t, tc.method, "payload")
				req.Header.Set("Authorization", "Bearer x")
				if tc.setup != nil {
					req = tc.setup(req)
				}
				before := *req
				beforeHeader := req.Header.Clone()
				beforeURL := *req.URL
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
				after := *req
				if !reflect.DeepEqual(req.Header, beforeHeader) {
					t.Errorf("got header %v after; want %v", req.Header, beforeHeader)
				}
				if *req.URL != beforeURL {
					t.Errorf("got URL %v after; want %v", req.URL, &beforeURL)
				}
				if reflect.ValueOf(before.GetBody).Pointer() != reflect.ValueOf(after.GetBody).Pointer() {
					t.Error("the caller's GetBody was replaced")
				}
				before.Header, after.Header = nil, nil
				before.GetBody, after.GetBody = nil, nil
				// Body and context are compared by identity: the same values.
				if !reflect.DeepEqual(before, after) {
					t.Errorf("the caller's request changed:\n got %+v\nwant %+v", after, before)
				}
			})
		})
	}
}

func TestCloneHeaderWith(t *testing.T) {
	h := http.Header{"A": {"1", "2"}, "B": {"3"}, "User-Agent": nil}
	got := cloneHeaderWith(h, "Idempotency-Key", "k", nil)
	want := http.Header{"A": {"1", "2"}, "B": {"3"}, "User-Agent": nil, "Idempotency-Key": {"k"}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %v; want %v", got, want)
	}
	got["A"] = append(got["A"], "x") // capped slices: no write into the neighbour
	got.Add("B", "y")
	if !reflect.DeepEqual(h, http.Header{"A": {"1", "2"}, "B": {"3"}, "User-Agent": nil}) {
		t.Errorf("the original changed: %v", h)
	}
	if got["Idempotency-Key"][0] != "k" {
		t.Errorf("got key %q after appends; want k", got["Idempotency-Key"])
	}
	if got := cloneHeaderWith(nil, "K", "v", nil); !reflect.DeepEqual(got, http.Header{"K": {"v"}}) {
		t.Errorf("nil header: got %v; want map[K:[v]]", got)
	}
}

func TestNewUUID(t *testing.T) {
	// Eight goroutines share one source, across many batch refills: every
	// key is a well-formed version 4 UUID, and none repeats.
	var (
		src  keySource
		mu   sync.Mutex
		seen = map[string]bool{}
		wg   sync.WaitGroup
	)
	const perGoroutine = 40 * keysPerBatch
	for range 8 {
		wg.Go(func() {
			keys := make([]string, 0, perGoroutine)
			for range perGoroutine {
				var k [36]byte
				src.newUUID(&k)
				keys = append(keys, string(k[:]))
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range keys {
				u, err := uuid.Parse(s)
				if err != nil || u.Version() != 4 || u.Variant() != uuid.RFC4122 || len(s) != 36 {
					t.Errorf("got %q (version %v, variant %v, err %v); want a 36-character version 4 UUID", s, u.Version(), u.Variant(), err)
					return
				}
				if seen[s] {
					t.Errorf("got %q twice", s)
					return
				}
				seen[s] = true
			}
		})
	}
	wg.Wait()
	if got, want := len(seen), 8*perGoroutine; got != want {
		t.Errorf("got %d distinct keys; want %d", got, want)
	}
}

func TestNewUUIDBitsAreRandom(t *testing.T) {
	// Each of the 122 random bits is set in about half of 4,096 keys; a
	// batch reused or left zeroed would pin bits to 0 or repeat keys.
	var src keySource
	const n = 4096
	var ones [128]int
	for range n {
		var k [36]byte
		src.newUUID(&k)
		u := uuid.MustParse(string(k[:]))
		for i := range 128 {
			if u[i/8]&(0x80>>(i%8)) != 0 {
				ones[i]++
			}
		}
	}
	fixed := map[int]bool{48: true, 49: true, 50: true, 51: true, 64: true, 65: true} // version and variant
	for i, c := range ones {
		if fixed[i] {
			continue
		}
		if c < n*2/5 || c > n*3/5 {
			t.Errorf("bit %d: set in %d of %d keys; want about half", i, c, n)
		}
	}
}

func TestEmptyIdempotencyKeyIsNoKey(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(http.Header)
	}{
		{"canonical", func(h http.Header) { h.Set("Idempotency-Key", "") }},
		{"written in lower case", func(h http.Header) { h["idempotency-key"] = []string{""} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(rht.CommitThenDrop(), rht.Status(201))
				req := newReq(t, "POST", `{"amount":100}`)
				tc.set(req.Header)
				before := req.Header.Clone()
				code, _, err := roundTrip(t, &Transport{Base: base}, req)
				if err != nil || code != 201 {
					t.Fatalf("got (%d, %v); want 201", code, err)
				}
				rht.AssertAttempts(t, base, 2)
				rht.AssertStableKey(t, base)
				if _, err := uuid.Parse(base.Attempts()[0].Key); err != nil {
					t.Errorf("got key %q; want a generated UUID", base.Attempts()[0].Key)
				}
				for i, a := range base.Attempts() {
					n := 0
					for k, vs := range a.Header {
						if strings.EqualFold(k, "Idempotency-Key") {
							n += len(vs)
						}
					}
					if n != 1 {
						t.Errorf("attempt %d: got %d Idempotency-Key values; want 1", i+1, n)
					}
				}
				if got := base.Effects(); got != 1 {
					t.Errorf("got %d effects; want 1", got)
				}
				if !equalHeader(req.Header, before) {
					t.Errorf("the caller's header changed: got %v; want %v", req.Header, before)
				}
			})
		})
	}
}

func equalHeader(a, b http.Header) bool {
	if len(a) != len(b) {
		return false
	}
	for k, vs := range a {
		if strings.Join(vs, "\x00") != strings.Join(b[k], "\x00") {
			return false
		}
	}
	return true
}

// A NewIdempotencyKey that returns "" gives a write no key: an empty value
// identifies nothing (headerKey's own rule), so the write must not be
// retried as if it were keyed.
func TestEmptyGeneratedIdempotencyKeyIsNoKey(t *testing.T) {
	var attempts atomic.Int32
	var keys []string
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		attempts.Add(1)
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if r.Body != nil {
			io.Copy(io.Discard, r.Body)
			r.Body.Close()
		}
		return &http.Response{StatusCode: 503, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})
	tr := &Transport{Base: base, Policy: Policy{BaseDelay: time.Millisecond, NewIdempotencyKey: func() string { return "" }}}
	req, _ := http.NewRequest("POST", "http://a.test/orders", strings.NewReader("pay 100"))
	roundTrip(t, tr, req)
	if n := attempts.Load(); n > 1 {
		t.Errorf("got %d attempts of a POST with keys %q; want 1: a write with an empty idempotency key is not idempotent", n, keys)
	}
}

// Under Policy.Timeout, the call sends a copy of the request that carries
// the Timeout's context. The key goes into that copy, so that a keyed write
// costs no second copy of the request. The test counts the bytes a write's
// key costs beyond a GET, with the Timeout and without it: the caller's key
// generator keeps the key source's pool out of the count.
func TestKeyUnderTimeoutReusesTheCopy(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation counts")
	}
	base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		if r.Body != nil {
			r.Body.Close()
		}
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
	})
	bytesPerRequest := func(p Policy, method string) int64 {
		p.NewIdempotencyKey = func() string { return "k" }
		tr := &Transport{Base: base, Policy: p}
		req, _ := http.NewRequest(method, "http://example.test/", nil)
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1)) // as testing.AllocsPerRun
		const runs = 1000
		least := uint64(math.MaxUint64)
		for range 3 { // the least of three: another goroutine's allocations only add
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			before := ms.TotalAlloc
			for range runs {
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			runtime.ReadMemStats(&ms)
			least = min(least, (ms.TotalAlloc-before)/runs)
		}
		return int64(least)
	}
	timeout := Policy{Timeout: time.Minute}
	with := bytesPerRequest(timeout, "POST") - bytesPerRequest(timeout, "GET")
	without := bytesPerRequest(Policy{}, "POST") - bytesPerRequest(Policy{}, "GET")
	t.Logf("a key beyond a GET: %d B under Policy.Timeout, %d B without it", with, without)
	if with >= without {
		t.Errorf("a key costs %d B beyond a GET under Policy.Timeout and %d B without it; want less under the Timeout, which already copies the request", with, without)
	}
}
