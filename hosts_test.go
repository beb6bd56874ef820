package retryhttp

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/herdproof/retryhttp/internal/ratio"
	rht "github.com/herdproof/retryhttp/retryhttptest"
)

// byHost routes each request to the scripted transport of its host.
type byHost map[string]*rht.Transport

func (b byHost) RoundTrip(r *http.Request) (*http.Response, error) {
	return b[r.URL.Host].RoundTrip(r)
}

func TestPerHostIsolatesBudgets(t *testing.T) {
	// down.test answers only 503; flaky.test fails each request's first
	// attempt and then answers 200. 100 requests go to down.test, then 100
	// to flaky.test. Shared, down.test spends the bucket (35 retries, 10
	// tokens left) and flaky.test's failures then get no retry; per host,
	// each has its own.
	tests := []struct {
		name                string
		perHost             *PerHost
		downAttempts        int
		flakyOK, flakyTries int
	}{
		{"shared budget", nil, 135, 0, 100},
		{"per host", &PerHost{}, 135, 100, 200},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				flaky := 0
				base := byHost{"down.test": rht.NewTransport(rht.Status(503))}
				tr := &Transport{Base: roundTripperFunc(func(r *http.Request) (*http.Response, error) {
					if r.URL.Host != "flaky.test" {
						return base.RoundTrip(r)
					}
					flaky++
					code := 200
					if requestAttempt(r) == 1 {
						code = 503
					}
					return &http.Response{StatusCode: code, Body: http.NoBody, Request: r}, nil
				}), PerHost: tc.perHost, Policy: Policy{SendAttemptHeader: true}}
				send := func(host string) int {
					req, _ := http.NewRequest("GET", "http://"+host+"/", nil)
					code, _, err := roundTrip(t, tr, req)
					if err != nil {
						t.Fatal(err)
					}
					return code
				}
				for range 100 {
					send("down.test")
				}
				ok := 0
				for range 100 {
					if send("flaky.test") == 200 {
						ok++
					}
				}
				if got := len(base["down.test"].Attempts()); got != tc.downAttempts {
					t.Errorf("down.test: got %d attempts; want %d", got, tc.downAttempts)
				}
				if ok != tc.flakyOK || flaky != tc.flakyTries {
					t.Errorf("flaky.test: got %d successes in %d attempts; want %d in %d", ok, flaky, tc.flakyOK, tc.flakyTries)
				}
			})
		})
	}
}

func TestPerHostIsolatesLimiters(t *testing.T) {
	// slow.test throttles; fast.test does not. Per host, fast.test's
	// requests never wait for a permit; shared, the start at 7/s (0.7 of
	// the demand, which the requests then raise) spaces them too: 20
	// permits, the first due a seventh of a second after the throttle,
	// take about 3 s.
	tests := []struct {
		name     string
		tr       func(http.RoundTripper) *Transport
		min, max time.Duration
	}{
		{"shared limiter", func(b http.RoundTripper) *Transport {
			return &Transport{Base: b, Limiter: &RateLimiter{}, Policy: Policy{MaxAttempts: 1}}
		}, 2 * time.Second, 4 * time.Second},
		{"per host", func(b http.RoundTripper) *Transport {
			return &Transport{Base: b, PerHost: &PerHost{Limiter: func(string) *RateLimiter { return &RateLimiter{} }}, Policy: Policy{MaxAttempts: 1}}
		}, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := byHost{"slow.test": rht.NewTransport(rht.Status(429)), "fast.test": rht.NewTransport(rht.Status(200))}
				tr := tc.tr(base)
				req := func(host string) *http.Request {
					r, _ := http.NewRequest("GET", "http://"+host+"/", nil)
					return r
				}
				roundTrip(t, tr, req("slow.test")) // a throttle: 7/s from now on, where it applies
				start := time.Now()
				for range 20 {
					roundTrip(t, tr, req("fast.test"))
				}
				if got := time.Since(start); got < tc.min || got > tc.max {
					t.Errorf("20 requests to fast.test took %v; want between %v and %v", got, tc.min, tc.max)
				}
			})
		})
	}
}

func TestPerHostDestinations(t *testing.T) {
	// Scheme, host and port name a destination; the default port and the
	// case of the host do not.
	var dests []string
	ph := &PerHost{Budget: func(dest string) Budget {
		dests = append(dests, dest)
		return newTokenBucket(10)
	}}
	for _, u := range []string{
		"http://a.test/x", "http://a.test:80/y", "http://A.TEST/z",
		"https://a.test/", "https://a.test:443/",
		"http://a.test:8080/",
		// An empty port is the default and a port is a number, as
		// net/http dials them.
		"http://a.test:/", "http://a.test:080/", "https://a.test:/", "http://a.test:08080/",
		"http://[::1]/", "http://[::1]:80/", "http://[::1]:8080/", "http://[::1]:/",
		// An IPv6 zone is an interface name: its case is its own.
		"http://[fe80::1%25eth0]/", "http://[FE80::1%25eth0]:80/", "http://[fe80::1%25ETH0]/",
	} {
		pu, _ := url.Parse(u)
		ph.get(pu)
	}
	want := []string{"http://a.test:80", "https://a.test:443", "http://a.test:8080", "http://[::1]:80", "http://[::1]:8080",
		"http://[fe80::1%eth0]:80", "http://[fe80::1%ETH0]:80"}
	if fmt.Sprint(dests) != fmt.Sprint(want) {
		t.Errorf("got destinations %v; want %v", dests, want)
	}
	if got := ph.count(); got != len(want) {
		t.Errorf("got %d destinations tracked; want %d", got, len(want))
	}
	if b, _, ok := ph.lookup("http://a.test:80/q"); !ok || b.Available() != 10 {
		t.Errorf("Lookup: got (%v, %v); want a.test's budget", b, ok)
	}
	if _, _, ok := ph.lookup("http://b.test/"); ok {
		t.Error("Lookup: found b.test, never sent to; want nothing")
	}
}

// keys reports how many spellings ph tracks, and checks that its count
// agrees.
func (ph *PerHost) keys(t *testing.T) int {
	t.Helper()
	ph.mu.Lock()
	defer ph.mu.Unlock()
	n := len(ph.dirty)
	ph.read.Load().each(func(hostKey, *host) { n++ })
	if n != ph.n {
		t.Errorf("got %d keys in the maps; the count says %d", n, ph.n)
	}
	return n
}

func TestPerHostSpellingsAreBounded(t *testing.T) {
	// Every spelling of a destination is a key, and counts against
	// MaxHosts: a stream of new spellings of one host (its case, its port
	// with leading zeros: a URL a caller does not control) never tracks
	// more than MaxHosts keys.
	tests := []struct {
		name     string
		maxHosts int
		urls     func(i int) string
	}{
		{"the case of one host", 8, func(i int) string {
			b := []byte("abcdefghijkl.test")
			for j := range 10 {
				if i&(1<<j) != 0 {
					b[j] -= 'a' - 'A'
				}
			}
			return "http://" + string(b) + "/"
		}},
		{"leading zeros of a port", 8, func(i int) string { return "http://a.test:" + strings.Repeat("0", i) + "8080/" }},
		{"new destinations, each first seen under another spelling", 2, func(i int) string { return fmt.Sprintf("http://H%d.test/", i) }},
		{"MaxHosts 1", 1, func(i int) string { return fmt.Sprintf("http://H%d.test:80/", i%3) }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ph := &PerHost{MaxHosts: tc.maxHosts}
			for i := range 1000 {
				u, err := url.Parse(tc.urls(i))
				if err != nil {
					t.Fatal(err)
				}
				ph.get(u)
				if got := ph.keys(t); got > tc.maxHosts {
					t.Fatalf("after %d requests: got %d keys tracked; want at most MaxHosts=%d", i+1, got, tc.maxHosts)
				}
			}
		})
	}
}

func TestPerHostMemoryIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ph := &PerHost{MaxHosts: 100, IdleTimeout: time.Minute}
		get := func(i int) {
			u, _ := url.Parse(fmt.Sprintf("http://h%d.test/", i))
			ph.get(u)
		}
		// A stream of new destinations: never more than MaxHosts.
		for i := range 1000 {
			get(i)
			if n := ph.count(); n > 100 {
				t.Fatalf("after %d destinations: got %d tracked; want at most 100", i+1, n)
			}
		}
		// Idle ones go when a new one comes; one still in use stays.
		time.Sleep(40 * time.Second)
		get(999) // in use
		time.Sleep(40 * time.Second)
		get(5000) // new: the sweep forgets what was idle for a minute
		if got := ph.count(); got != 2 {
			t.Errorf("got %d destinations after the idle ones expired; want 2 (the one in use and the new one)", got)
		}
		if _, _, ok := ph.lookup("http://h999.test/"); !ok {
			t.Error("the destination in use was forgotten")
		}
	})
}

func TestPerHostBudgetKinds(t *testing.T) {
	// Any Budget per destination: here a RatioBudget, whose refunds
	// go to the destination that paid.
	synctest.Test(t, func(t *testing.T) {
		ph := &PerHost{Budget: func(string) Budget { return &ratioBudget{ratio.Budget{PerSecond: -1}} }}
		base := byHost{"a.test": rht.NewTransport(rht.Status(200)), "b.test": rht.NewTransport(rht.Status(503))}
		tr := &Transport{Base: base, PerHost: ph}
		for range 100 {
			r, _ := http.NewRequest("GET", "http://a.test/", nil)
			roundTrip(t, tr, r)
		}
		r, _ := http.NewRequest("GET", "http://b.test/", nil)
		roundTrip(t, tr, r)
		// b.test has one request in its window and no minimum: 10% of 1
		// allows no retry, whatever a.test did.
		rht.AssertAttempts(t, base["b.test"], 1)
		a, _, _ := ph.lookup("http://a.test/")
		if got := a.Available(); got != 10 {
			t.Errorf("a.test: got %d retries available; want 10", got)
		}
	})
}

func TestPerHostUnderConcurrency(t *testing.T) {
	// 20 goroutines over 20 destinations, with MaxHosts 8: lookups, adds
	// and sweeps race; every request gets an answer.
	ph := &PerHost{MaxHosts: 8}
	tr := &Transport{Base: rht.NewTransport(rht.Status(503), rht.Status(200).Times(1000000)), PerHost: ph, Policy: fast}
	var wg sync.WaitGroup
	for g := range 20 {
		wg.Go(func() {
			for i := range 40 {
				r, _ := http.NewRequest("GET", fmt.Sprintf("http://h%d.test/", (g+i)%20), nil)
				if _, _, err := roundTrip(t, tr, r); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := ph.count(); n > 8 {
		t.Errorf("got %d destinations tracked; want at most 8", n)
	}
}

func TestPerHostHedgeDelays(t *testing.T) {
	// With PerHost and HedgeQuantile, each destination measures its own
	// latencies: after 20 answers, fast.test (1ms) hedges after 1.12ms and
	// slow.test (50ms) after 51.2ms, the tops of their buckets.
	synctest.Test(t, func(t *testing.T) {
		base := byHost{
			"fast.test": rht.NewTransport(rht.Status(200).WithDelay(time.Millisecond).Times(20), rht.Status(200).WithDelay(time.Second), rht.Status(200)),
			"slow.test": rht.NewTransport(rht.Status(200).WithDelay(50*time.Millisecond).Times(20), rht.Status(200).WithDelay(time.Second), rht.Status(200)),
		}
		tr := &Transport{Base: base, PerHost: &PerHost{}, Policy: Policy{HedgeQuantile: 0.95, HedgeRatio: 1}}
		get := func(host string) time.Duration {
			r, _ := http.NewRequest("GET", "http://"+host+"/", nil)
			start := time.Now()
			roundTrip(t, tr, r)
			return time.Since(start)
		}
		for range 20 {
			get("fast.test")
			get("slow.test")
		}
		synctest.Wait()
		for host, want := range map[string]time.Duration{"fast.test": 1120 * time.Microsecond, "slow.test": 51200 * time.Microsecond} {
			if got := get(host); got != want {
				t.Errorf("%s: the hedged request took %v; want %v (its own 95th percentile)", host, got, want)
			}
		}
		time.Sleep(time.Second) // the slow first copies, canceled, let go
	})
}

func TestBudgetInUseWithPerHost(t *testing.T) {
	// With PerHost, the Transport's own budget pays for nothing:
	// BudgetInUse says so, and the destination's budget is the one spent.
	synctest.Test(t, func(t *testing.T) {
		ph := &PerHost{}
		tr := &Transport{Base: rht.NewTransport(rht.Status(503)), PerHost: ph, Policy: Policy{Rand: lowRand}}
		if b := tr.budgetInUse(); b != nil {
			t.Errorf("BudgetInUse: got %v; want nil", b)
		}
		req, _ := http.NewRequest("GET", "http://a.test/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		b, _, _ := ph.lookup("http://a.test/")
		if got, want := b.Available(), DefaultBudgetTokens-2*RetryCost; got != want {
			t.Errorf("the destination's budget: got %d tokens; want %d (two retries paid)", got, want)
		}
	})
}

func TestPerHostChurn(t *testing.T) {
	// Sixteen goroutines over forty destinations (in several spellings,
	// some rate limited, some failing, all hedged) while sweeps run all
	// the time (IdleTimeout 1ms, MaxHosts 16): every request answers, and
	// the keys tracked agree with the count and stay within MaxHosts.
	shared := newTokenBucket(1 << 20)
	for _, tc := range []struct {
		name   string
		budget func(string) Budget
	}{
		{"nil func", nil},
		{"returns nil", func(string) Budget { return nil }},
		{"returns a nil *tokenBucket", func(string) Budget { var b *tokenBucket; return b }},
		{"the same for all", func(string) Budget { return shared }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim := &RateLimiter{}
			ph := &PerHost{MaxHosts: 16, IdleTimeout: time.Millisecond, Budget: tc.budget,
				Limiter: func(d string) *RateLimiter {
					if strings.Contains(d, "h1") {
						return lim
					}
					return nil
				}}
			base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
				code := 200
				if strings.HasPrefix(r.URL.Host, "h3") {
					code = 503
				}
				return &http.Response{StatusCode: code, Header: http.Header{}, Body: http.NoBody, Request: r}, nil
			})
			tr := &Transport{Base: base, PerHost: ph, Policy: Policy{BaseDelay: time.Microsecond, HedgeDelay: time.Millisecond, HedgeRatio: 1}}
			var checker, requests sync.WaitGroup
			var stop atomic.Bool
			checker.Go(func() {
				for !stop.Load() {
					if k := ph.keys(t); k > 16 {
						t.Errorf("got %d keys tracked; want at most MaxHosts=16", k)
						return
					}
				}
			})
			for g := range 16 {
				requests.Go(func() {
					for i := range 300 {
						host := fmt.Sprintf("h%d.test", (g*7+i)%40)
						switch i % 4 {
						case 1:
							host = strings.ToUpper(host)
						case 2:
							host += ":80"
						case 3:
							host = "[::" + fmt.Sprint(i%5+1) + "]"
						}
						r, _ := http.NewRequest("GET", "http://"+host+"/", nil)
						resp, err := tr.RoundTrip(r)
						if err != nil {
							t.Error(err)
							return
						}
						resp.Body.Close()
					}
				})
			}
			requests.Wait()
			stop.Store(true)
			checker.Wait()
			ph.keys(t)
		})
	}
}

func TestPerHostSpellingsKeepTheirDestination(t *testing.T) {
	// One destination under a spelling that is not the canonical one: made
	// once, its budget kept across requests, whether MaxHosts leaves room
	// for the spelling (2) or not (1: it is not kept, looked up each time).
	for _, tc := range []struct {
		name     string
		maxHosts int
		urls     []string
	}{
		{"MaxHosts 1, one non-canonical spelling", 1, []string{"http://A.test/", "http://A.test/", "http://A.test/"}},
		{"MaxHosts 2, canonical then another spelling", 2, []string{"http://a.test/", "http://A.test/", "http://a.test/"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				made := 0
				ph := &PerHost{MaxHosts: tc.maxHosts, Budget: func(string) Budget { made++; return newTokenBucket(DefaultBudgetTokens) }}
				tr := &Transport{Base: rht.NewTransport(rht.Status(503)), PerHost: ph, Policy: Policy{Rand: lowRand}}
				for _, u := range tc.urls {
					req, _ := http.NewRequest("GET", u, nil)
					if _, _, err := roundTrip(t, tr, req); err != nil {
						t.Fatal(err)
					}
				}
				b, _, _ := ph.lookup("http://a.test/")
				want := DefaultBudgetTokens - len(tc.urls)*2*RetryCost
				if made != 1 || b.Available() != want {
					t.Errorf("got the destination made %d times, %d tokens left; want once, %d left (MaxHosts %d never exceeded: one destination)",
						made, b.Available(), want, tc.maxHosts)
				}
			})
		})
	}
}

func TestPerHostInvariants(t *testing.T) {
	// Random spellings of a few destinations, small MaxHosts, idle gaps:
	// after each lookup the count agrees with the maps, at most MaxHosts
	// keys are tracked, and the spellings of one destination never name
	// two destinations at once.
	spell := []func(i int) string{
		func(i int) string { return fmt.Sprintf("http://h%d.test/", i) },
		func(i int) string { return fmt.Sprintf("http://H%d.test/", i) },
		func(i int) string { return fmt.Sprintf("http://h%d.test:80/", i) },
		func(i int) string { return fmt.Sprintf("http://h%d.test:080/", i) },
		func(i int) string { return fmt.Sprintf("http://h%d.test:/", i) },
		func(i int) string { return fmt.Sprintf("https://h%d.test:443/", i) },
		func(i int) string { return fmt.Sprintf("https://H%d.TEST:0443/", i) },
	}
	for maxHosts := 1; maxHosts <= 12; maxHosts++ {
		t.Run(fmt.Sprint(maxHosts), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(maxHosts), 7))
				ph := &PerHost{MaxHosts: maxHosts, IdleTimeout: time.Minute}
				for i := range 3000 {
					if rng.IntN(50) == 0 {
						time.Sleep(time.Duration(rng.IntN(40)) * time.Second)
					}
					u, err := url.Parse(spell[rng.IntN(len(spell))](rng.IntN(5)))
					if err != nil {
						t.Fatal(err)
					}
					h := ph.get(u)
					if n := ph.keys(t); n > maxHosts {
						t.Fatalf("step %d: %d keys; want at most %d", i, n, maxHosts)
					}
					canon := map[hostKey]*host{}
					ph.mu.Lock()
					check := func(k hostKey, hh *host) {
						c := k.canonical()
						if o, ok := canon[c]; ok && o != hh {
							t.Errorf("step %d: %v names another host than another spelling of %v", i, k, c)
						}
						canon[c] = hh
					}
					ph.read.Load().each(check)
					for k, hh := range ph.dirty {
						check(k, hh)
					}
					ph.mu.Unlock()
					if got, ok := canon[hostKey{u.Scheme, u.Host}.canonical()]; ok && got != h {
						t.Fatalf("step %d: get returned a host that is not the one tracked for %v", i, u)
					}
				}
			})
		})
	}
}

func TestPerHostSweepsOnlyWhenFull(t *testing.T) {
	// Seven destinations tracked with MaxHosts 8, then a second spelling of
	// one of them: eight keys, within MaxHosts, so nothing is forgotten.
	synctest.Test(t, func(t *testing.T) {
		ph := &PerHost{MaxHosts: 8}
		for i := range 7 {
			u, _ := url.Parse(fmt.Sprintf("http://h%d.test/", i))
			ph.get(u)
			time.Sleep(time.Second)
		}
		u, _ := url.Parse("http://H6.test/")
		ph.get(u)
		if got := ph.count(); got != 7 {
			t.Errorf("got %d destinations tracked, %d keys; want 7 destinations, 8 keys (MaxHosts 8 not passed)", got, ph.keys(t))
		}
	})
}

// PerHost with a tiny MaxHosts, hedging by quantile, a Limiter and a
// budget per destination, redirects across destinations followed by an
// http.Client, and 8 goroutines: every request gets an answer, nothing
// races (run with -race), and no more than MaxHosts are tracked. In fake
// time: the limiters' waits take none.
func TestPerHostChurnWithEverything(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		base := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if r.Body != nil {
				r.Body.Close()
			}
			h := http.Header{}
			code := 200
			switch {
			case strings.HasPrefix(r.URL.Path, "/redirect"):
				code = 307
				h.Set("Location", "http://h"+r.URL.Path[len("/redirect"):]+".test/")
			case len(r.URL.Host)%3 == 0:
				code = 503
			case len(r.URL.Host)%3 == 1:
				code = 429
				h.Set("Retry-After", "0")
			}
			select {
			case <-time.After(time.Duration(len(r.URL.Host)) * 100 * time.Microsecond):
			case <-r.Context().Done():
				return nil, r.Context().Err()
			}
			return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(strings.NewReader("x")), Request: r}, nil
		})
		ph := &PerHost{MaxHosts: 3, IdleTimeout: time.Millisecond,
			Limiter: func(string) *RateLimiter { return &RateLimiter{} },
			Budget:  func(string) Budget { return &ratioBudget{} }}
		tr := &Transport{Base: base, PerHost: ph, Policy: Policy{BaseDelay: time.Microsecond, ThrottleBaseDelay: time.Microsecond,
			MaxDelay: time.Millisecond, MaxServerDelay: time.Millisecond, HedgeQuantile: 0.5, HedgeRatio: 1, MaxHedges: 3, Timeout: 5 * time.Second}}
		client := &http.Client{Transport: tr}
		done := make(chan struct{})
		var errs atomic.Int32
		for g := range 8 {
			go func() {
				defer func() { done <- struct{}{} }()
				for i := range 20 {
					u := "http://h" + itoa((g*7+i)%11) + ".test/"
					if i%4 == 0 {
						u += "redirect" + itoa(i%5)
					}
					req, _ := http.NewRequest("PUT", u, strings.NewReader("body"))
					resp, err := client.Do(req)
					if err != nil && !errors.Is(err, ErrRateLimited) {
						if errs.Add(1) < 5 {
							t.Logf("%s: %v", u, err)
						}
					}
					if err != nil {
						continue
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
		}
		for range 8 {
			<-done
		}
		if n := ph.count(); n > 3 {
			t.Errorf("got %d destinations tracked; want at most 3", n)
		}
		if errs.Load() != 0 {
			t.Errorf("got %d errors; want 0", errs.Load())
		}
	})
}

// A PerHost.Budget or PerHost.Limiter func that panics: the panic reaches
// the caller, the request body is closed once, and the PerHost still works
// for the next request. (Held.)
func TestPerHostFuncPanics(t *testing.T) {
	var calls atomic.Int32
	ph := &PerHost{Budget: func(string) Budget {
		if calls.Add(1) == 1 {
			panic("budget func")
		}
		return newTokenBucket(100)
	}}
	tr := &Transport{Base: rht.NewTransport(rht.Status(200)), PerHost: ph, Policy: Policy{Timeout: time.Minute}}
	var closed atomic.Int32
	req, _ := http.NewRequest("PUT", "http://a.test/", closeTracker{strings.NewReader("x"), &closed})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("got no panic; want it to reach the caller")
			}
		}()
		tr.RoundTrip(req)
	}()
	if closed.Load() != 1 {
		t.Errorf("got the body closed %d times; want 1", closed.Load())
	}
	if code, _, err := roundTrip(t, tr, newReq(t, "GET", "")); err != nil || code != 200 {
		t.Errorf("next request: got (%d, %v); want 200", code, err)
	}
}

// A request with no URL is an error for http.Transport ("http: nil
// Request.URL"), and for a Transport without PerHost; with PerHost,
// RoundTrip dereferences it and panics.
func TestNilURLWithPerHost(t *testing.T) {
	for _, tc := range []struct {
		name string
		ph   *PerHost
	}{{"no PerHost", nil}, {"PerHost", &PerHost{}}} {
		t.Run(tc.name, func(t *testing.T) {
			tr := &Transport{Base: &http.Transport{}, PerHost: tc.ph}
			req := &http.Request{Method: "GET", Header: http.Header{}}
			var resp *http.Response
			var err error
			func() {
				defer func() {
					if p := recover(); p != nil {
						err = fmt.Errorf("panic: %v", p)
						t.Errorf("RoundTrip panicked (%v); want an error, as http.Transport returns", p)
					}
				}()
				resp, err = tr.RoundTrip(req)
			}()
			if resp != nil || err == nil {
				t.Errorf("got (%v, %v); want an error", resp, err)
			}
		})
	}
}
