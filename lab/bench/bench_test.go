package bench

import (
	"bytes"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync/atomic"
	"testing"
	"time"
)

// canned is a 200 (or other status) with a small body, made in one
// allocation so that the floor is as low as a real base allows.
type canned struct {
	resp http.Response
	body cannedBody
}

type cannedBody struct{ done bool }

func (b *cannedBody) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	b.done = true
	return copy(p, "hello world"), nil
}
func (b *cannedBody) Close() error { return nil }

// stub is an in-memory base: it reads the request body, as a transport
// would, and answers from codes in turn (the last one repeats for a
// single-code stub).
type stub struct {
	codes []int
	n     atomic.Int64
}

func newStub(codes ...int) *stub { return &stub{codes: codes} }

func (s *stub) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	i := s.n.Add(1) - 1
	c := &canned{}
	c.resp = http.Response{StatusCode: s.codes[int(i)%len(s.codes)], Header: http.Header{}, Body: &c.body, Request: req, ContentLength: 11}
	return &c.resp, nil
}

// reusableReq is a request whose 4 KiB body (or none) is rewound before
// every use, so that a benchmark loop costs the same for every impl.
type reusableReq struct {
	req     *http.Request
	reader  *bytes.Reader
	body    io.ReadCloser
	payload []byte
}

func newReq(method, url string, size int) *reusableReq {
	r := &reusableReq{payload: make([]byte, size)}
	if size == 0 {
		r.req, _ = http.NewRequest(method, url, nil)
		return r
	}
	r.reader = bytes.NewReader(r.payload)
	r.req, _ = http.NewRequest(method, url, r.reader)
	r.body = r.req.Body
	return r
}

func (r *reusableReq) next() *http.Request {
	if r.reader != nil {
		r.reader.Reset(r.payload)
		r.req.Body = r.body // failsafehttp replaces the caller's Body: put ours back
	}
	return r.req
}

func do(b *testing.B, rt http.RoundTripper, req *http.Request) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		b.Fatalf("got %d; want 200", resp.StatusCode)
	}
}

// Workload 1: the success path, in-memory base.
func BenchmarkSuccess(b *testing.B) {
	for _, w := range []struct {
		name   string
		method string
		size   int
	}{{"GET", "GET", 0}, {"POST4K", "POST", 4096}} {
		for _, impl := range Impls {
			b.Run(w.name+"/"+impl.Name, func(b *testing.B) {
				rt := impl.New(newStub(200), false)
				r := newReq(w.method, "http://bench.test/", w.size)
				b.ReportAllocs()
				for b.Loop() {
					do(b, rt, r.next())
				}
			})
		}
	}
}

// Workload 2 and 4: the success path over loopback, sequential and
// parallel (run with -cpu 1,2 for the contention figures).
func BenchmarkLoopback(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello world")
	}))
	defer srv.Close()
	for _, impl := range Impls {
		base := &http.Transport{MaxIdleConnsPerHost: 64}
		rt := impl.New(base, false)
		b.Run("seq/"+impl.Name, func(b *testing.B) {
			r := newReq("GET", srv.URL, 0)
			b.ReportAllocs()
			for b.Loop() {
				do(b, rt, r.next())
			}
		})
		b.Run("par/"+impl.Name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				r := newReq("GET", srv.URL, 0)
				for pb.Next() {
					do(b, rt, r.next())
				}
			})
		})
		base.CloseIdleConnections()
	}
}

// Workload 4: the in-memory success path from every proc at once.
func BenchmarkContention(b *testing.B) {
	for _, impl := range Impls {
		b.Run(impl.Name, func(b *testing.B) {
			rt := impl.New(newStub(200), false)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				r := newReq("GET", "http://bench.test/", 0)
				for pb.Next() {
					do(b, rt, r.next())
				}
			})
		})
	}
}

// Workload 3: one retry (503, then 200) with the waits forced to zero. The
// base row makes the same two calls by hand: the difference is the retry
// bookkeeping.
func BenchmarkRetry(b *testing.B) {
	for _, impl := range Impls {
		b.Run(impl.Name, func(b *testing.B) {
			s := newStub(503, 200)
			var rt http.RoundTripper = twoCalls{s}
			if impl.Name != "base" {
				rt = impl.New(s, true)
			}
			r := newReq("GET", "http://bench.test/", 0)
			b.ReportAllocs()
			for b.Loop() {
				do(b, rt, r.next())
			}
		})
	}
}

var blocks = flag.Int("paired.blocks", 51, "BenchmarkPaired: alternating blocks per impl")

// BenchmarkPaired times each impl against the bare base in alternating
// blocks inside one benchmark, so that a shared, noisy machine slows both
// alike, and reports the median of the per-block ratios and of the extra
// time per request. Compare impls by these, not by ns/op across runs.
func BenchmarkPaired(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "hello world")
	}))
	defer srv.Close()
	workloads := []struct {
		name   string
		base   func() http.RoundTripper
		method string
		url    string
		size   int
	}{
		{"GET", func() http.RoundTripper { return newStub(200) }, "GET", "http://bench.test/", 0},
		{"POST4K", func() http.RoundTripper { return newStub(200) }, "POST", "http://bench.test/", 4096},
		{"loopback", func() http.RoundTripper { return &http.Transport{MaxIdleConnsPerHost: 64} }, "GET", srv.URL, 0},
	}
	for _, w := range workloads {
		for _, impl := range Impls[1:] {
			b.Run(w.name+"/"+impl.Name, func(b *testing.B) {
				base := w.base()
				rt := impl.New(base, false)
				r := newReq(w.method, w.url, w.size)
				nb := *blocks
				per := max(b.N/(2*nb), 1)
				run := func(x http.RoundTripper) float64 {
					start := time.Now()
					for range per {
						do(b, x, r.next())
					}
					return float64(time.Since(start)) / float64(per)
				}
				var ratios, extra []float64
				for i := range nb {
					var tb, ti float64
					if i%2 == 0 { // alternate which goes first
						tb, ti = run(base), run(rt)
					} else {
						ti, tb = run(rt), run(base)
					}
					ratios = append(ratios, ti/tb)
					extra = append(extra, ti-tb)
				}
				b.ReportMetric(median(ratios), "ratio")
				b.ReportMetric(median(extra), "extra-ns/req")
				if t, ok := base.(*http.Transport); ok {
					t.CloseIdleConnections()
				}
			})
		}
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// twoCalls is the floor of the retry workload: the two calls made by hand,
// the 503 drained and closed, then the 200.
type twoCalls struct{ s *stub }

func (c twoCalls) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, _ := c.s.RoundTrip(req)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return c.s.RoundTrip(req)
}
