package bench

import (
	"errors"
	"math/rand/v2"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"
)

func TestHedgeGoalsCheck(t *testing.T) {
	st := func(x float64) Stat { return Stat{Num(x), Num(x), Num(x)} }
	sums := []HedgeSummary{
		{Workload: HedgeTail, Proto: "http1", Peer: HedgePeerFailsafe, P999Ms: st(10), RequestsPerRequest: st(1.07)},
		{Workload: HedgeTail, Proto: "http1", Peer: "mine", P999Ms: st(12), RequestsPerRequest: st(1.06)},
		{Workload: HedgeSlowAll, Proto: "http1", Peer: "mine", RequestsPerRequest: st(1.051), FirstSecond: st(1.4)},
		{Workload: HedgeTail, Proto: "h2c", Peer: HedgePeerFailsafe, P999Ms: st(10), RequestsPerRequest: st(1.07)},
		{Workload: HedgeTail, Proto: "h2c", Peer: "mine", P999Ms: st(12.5), RequestsPerRequest: st(1.03)},
	}
	var got []string
	for _, c := range CheckHedgeGoals(sums, "mine", IssueHedgeGoals()) {
		got = append(got, c.String())
	}
	want := []string{
		"mine on tail-1%/http1: p99.9 met (p99.9 12.0 ms; want <= 12.0 ms (1.2x failsafe's 10.0 ms))",
		"mine on tail-1%/http1: copies met (1.060 copies a request; want <= 1.06)",
		"mine on slow-all-5s/http1: copies NOT met (1.051 copies a request over the run (1.400 in its first second); want <= 1.05)",
		"mine on tail-1%/h2c: p99.9 NOT met (p99.9 12.5 ms; want <= 12.0 ms (1.2x failsafe's 10.0 ms))",
		"mine on tail-1%/h2c: copies met (1.030 copies a request; want <= 1.06)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%q\nwant\n%q", got, want)
	}
}

// TestHedgeMatrixHarness checks the hedging harness over loopback: h2c is
// HTTP/2, copies are counted per request, and a hedge that never wins (every
// copy slower than the delay) doubles the copies when nothing limits it.
func TestHedgeMatrixHarness(t *testing.T) {
	for _, proto := range hedgeProtos {
		t.Run(proto, func(t *testing.T) {
			h2c := proto == "h2c"
			srv := newHedgeServer(Latency{Kind: "constant", Slow: time.Millisecond}, 1, h2c)
			defer srv.Close()
			base := hedgeBase(1, h2c)
			defer base.CloseIdleConnections()
			resp, err := base.RoundTrip(httptestGet(t, srv.URL))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if want := map[bool]int{false: 1, true: 2}[h2c]; resp.ProtoMajor != want {
				t.Errorf("got %s; want HTTP/%d", resp.Proto, want)
			}
		})
	}
	w := HedgeWorkload{Name: "slow", Latency: Latency{Kind: "constant", Slow: 100 * time.Millisecond}, Workers: 2, Requests: 6}
	peers := DefaultHedgePeers()
	for _, tc := range []struct {
		peer   string
		copies float64
	}{{HedgePeerNone, 1}, {HedgePeerFailsafe, 2}} {
		p, _ := findHedgePeer(peers, tc.peer)
		r := runHedgeOnce(w, "http1", p, 5*time.Millisecond, 1)
		if r.Requests != 6 || r.RequestsPerRequest != tc.copies || r.FirstSecond != tc.copies || r.P50Ms < 100 {
			t.Errorf("%s: got %d requests, %v copies a request (%v in the first second), p50 %v ms; want 6, %v, %v, at least 100 ms",
				tc.peer, r.Requests, r.RequestsPerRequest, r.FirstSecond, r.P50Ms, tc.copies, tc.copies)
		}
	}
}

// A request that fails is counted in Failed, not dropped: an error, a status
// other than 200, or a body cut short.
func TestHedgeMatrixCountsFailures(t *testing.T) {
	w := HedgeWorkload{Name: "fast", Latency: Latency{Kind: "constant", Slow: time.Millisecond}, Workers: 2, Requests: 9}
	var n atomic.Int32
	peer := HedgePeer{Name: "flaky", New: func(base http.RoundTripper, _ time.Duration) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			switch n.Add(1) % 3 {
			case 1:
				return nil, errors.New("refused")
			case 2:
				resp, err := base.RoundTrip(req)
				if err == nil {
					resp.StatusCode = http.StatusServiceUnavailable
				}
				return resp, err
			}
			return base.RoundTrip(req)
		})
	}}
	if r := runHedgeOnce(w, "http1", peer, time.Millisecond, 1); r.Requests != 9 || r.Failed != 6 {
		t.Errorf("got %d requests, %d failed; want 9, 6", r.Requests, r.Failed)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func httptestGet(t *testing.T, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

func TestLatencyDraw(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tail := Latency{Kind: "tail", Min: time.Millisecond, Max: 3 * time.Millisecond, Slow: time.Second, SlowShare: 0.01}
	slow := 0
	for range 100000 {
		switch d := tail.draw(r); {
		case d == time.Second:
			slow++
		case d < time.Millisecond || d > 3*time.Millisecond:
			t.Fatalf("tail: got %v; want 1 s or within [1 ms, 3 ms]", d)
		}
	}
	if slow < 900 || slow > 1100 { // 1%: 1,000 expected, sd about 31
		t.Errorf("tail: got %d slow of 100,000; want about 1,000", slow)
	}
	logn := Latency{Kind: "lognormal", Median: 2 * time.Millisecond, Sigma: 1, Slow: time.Second}
	var below int
	for range 100000 {
		if d := logn.draw(r); d < 2*time.Millisecond {
			below++
		} else if d > time.Second {
			t.Fatalf("lognormal: got %v; want at most the cap, 1 s", d)
		}
	}
	if below < 49000 || below > 51000 {
		t.Errorf("lognormal: got %d of 100,000 below the median; want about half", below)
	}
}
