package redisbudget

import (
	"context"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
)

// Concurrent withdrawals share one call to a stalled Redis: each returns
// within about Timeout, however many wait (they used to queue behind the
// mutex, one Timeout each: 3 s for the last of 30).
func TestStalledRedisHoldsNoWithdrawalPastTimeout(t *testing.T) {
	const timeout = 100 * time.Millisecond
	s := startRedis(t)
	b := newBudget(t, s.client(), "fleet", func(o *Options) { o.Timeout = timeout })
	b.Withdraw(context.Background(), retryhttp.Transient) // connected, script loaded, lease of 28
	b.Withdraw(context.Background(), retryhttp.Transient) // the lease is spent
	s.pause()
	defer s.resume()
	times := make([]time.Duration, 30)
	var refused atomic.Int32
	var wg sync.WaitGroup
	for i := range times {
		wg.Go(func() {
			start := time.Now()
			if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
				refused.Add(1)
			}
			times[i] = time.Since(start)
		})
	}
	wg.Wait()
	slices.Sort(times)
	worst := times[len(times)-1]
	t.Logf("30 concurrent withdrawals against a paused Redis: median %v, worst %v", times[len(times)/2], worst)
	if worst > timeout+50*time.Millisecond {
		t.Errorf("the slowest withdrawal took %v; want about the %v Timeout", worst, timeout)
	}
	if refused.Load() != 0 {
		t.Errorf("got %d refused; want 0: the fallback pays while Redis does not answer", refused.Load())
	}
	if st := b.Stats(); st.Calls != 2 {
		t.Errorf("got %d calls to Redis; want 2 (the refill before the pause, one shared call during it)", st.Calls)
	}
}

// No lease path grants more than the bucket holds: a retry (14 tokens)
// against a Lease of 5 takes 14, and a bucket of 28 pays for two retries,
// not three (a lease smaller than a payment used to go below zero).
func TestSmallLeasePaysForARetry(t *testing.T) {
	s := startRedis(t)
	b := newBudget(t, s.client(), "fleet", func(o *Options) {
		o.Capacity = 2 * retryhttp.RetryCost
		o.Lease = retryhttp.ThrottleRetryCost
	})
	var granted int
	for i := range 3 {
		if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); ok {
			granted++
		}
		if b.Available() < 0 {
			t.Errorf("after retry %d: the lease holds %d; want at least 0", i+1, b.Available())
		}
	}
	if granted != 2 {
		t.Errorf("got %d retries granted from a bucket of 28; want 2", granted)
	}
	if got := s.tokens("fleet"); got != 0 {
		t.Errorf("got %d tokens in Redis; want 0", got)
	}
	if st := b.Stats(); st.Taken != 2*retryhttp.RetryCost {
		t.Errorf("got %d tokens taken; want 28", st.Taken)
	}
}

// A call that times out may still run when Redis resumes. The next call
// carries the same totals, so the deposits are credited once either way
// (they used to be sent again: 50 successes credited 100), and the tokens
// the late run granted reach the lease, with its answer or the next one.
func TestDepositsCreditedOnceAfterATimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts redis.Options // the client's; the budget's Timeout bounds the wait either way
	}{
		{"the late answer is lost", redis.Options{ContextTimeoutEnabled: true}},
		{"the late answer comes", redis.Options{ReadTimeout: 5 * time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startRedis(t)
			opts := tc.opts
			opts.Addr, opts.MaxRetries = s.addr(), -1
			rdb := redis.NewClient(&opts)
			defer rdb.Close()
			s.client().HSet(context.Background(), "fleet", "tokens", 100)
			b := newBudget(t, rdb, "fleet", func(o *Options) {
				// Long enough that no call but the paused one times out on
				// a loaded machine: one that did would change what the
				// test follows.
				o.Timeout = time.Second
				o.RetryAfter = 10 * time.Millisecond
				o.Recheck = time.Hour // no call carries deposits alone here
			})
			b.Withdraw(context.Background(), retryhttp.Transient) // leases 28: 72 left
			for range 50 {
				b.Deposit(true)
			}
			b.Withdraw(context.Background(), retryhttp.Transient) // the lease is spent
			if st := b.Stats(); st.Failures != 0 || st.FallbackPayments != 0 {
				t.Fatalf("before the pause: got %d failed calls, %d retries paid by the fallback; want none", st.Failures, st.FallbackPayments)
			}
			s.pause()
			if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok { // carries the 50, no answer
				t.Fatal("refused; want the fallback to pay")
			}
			if tc.opts.ReadTimeout == 0 {
				// The client gives up at its context's deadline, which may
				// come a little after the budget's own timer: a Redis
				// resumed before then would still answer in time.
				waitFor(t, "the client to give up", func() bool { return b.out.Load() == 0 })
			}
			s.resume()
			// Redis runs the call it had read: +50, -28.
			waitFor(t, "Redis to run the late call", func() bool { return s.tokens("fleet") == 72+50-28 })
			if tc.opts.ReadTimeout > 0 {
				waitFor(t, "the late answer", func() bool { return b.Stats().Taken == 56 })
			}
			time.Sleep(20 * time.Millisecond) // past RetryAfter
			// Spend what the late answer leased, if it came, up to the next
			// call, which has no deposits to carry.
			for calls := b.Stats().Calls; b.Stats().Calls == calls; {
				b.Withdraw(context.Background(), retryhttp.Transient)
			}
			if got, want := s.tokens("fleet"), int64(72+50-28-28); got != want {
				t.Errorf("got %d tokens in Redis; want %d (the 50 deposits credited once)", got, want)
			}
			// Three batches: before the pause, the late run's, the last.
			if st := b.Stats(); st.Credited != 50 || st.Dropped != 0 || st.Taken != 3*28 {
				t.Errorf("got %d deposits confirmed, %d of unknown fate, %d tokens taken; want 50, 0, 84", st.Credited, st.Dropped, st.Taken)
			}
		})
	}
}

// A retry paid by the fallback and refunded after Redis came back gives its
// tokens back to the fallback, not to the fleet's lease (it used to add 14
// tokens to the fleet).
func TestRefundGoesToWhoPaid(t *testing.T) {
	s := startRedis(t)
	fb := retryhttp.NewTokenBucket(500)
	b := newBudget(t, s.client(), "fleet", func(o *Options) {
		o.Timeout = 100 * time.Millisecond
		o.RetryAfter = 10 * time.Millisecond
		o.Fallback = fb
	})
	b.Withdraw(context.Background(), retryhttp.Transient)
	b.Withdraw(context.Background(), retryhttp.Transient) // the lease is spent; Redis holds 472
	s.stop()
	paid, ok := b.Withdraw(context.Background(), retryhttp.Transient)
	if down, _ := b.Fallback(); !ok || !down || fb.Available() != 486 {
		t.Fatalf("with Redis stopped: got ok %v, fallback %v, %d in the fallback; want true, true, 486", ok, down, fb.Available())
	}
	s.start() // a fresh bucket of 500
	time.Sleep(20 * time.Millisecond)
	if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
		t.Fatal("refused after Redis came back")
	}
	if down, err := b.Fallback(); down {
		t.Fatalf("still falling back: %v", err)
	}
	lease, redisTokens := b.Available(), s.tokens("fleet")
	paid(true) // the retry the fallback paid succeeded
	if fb.Available() != 500 || b.Available() != lease || s.tokens("fleet") != redisTokens {
		t.Errorf("after the refund: got %d in the fallback, %d in the lease, %d in Redis; want 500, %d, %d",
			fb.Available(), b.Available(), s.tokens("fleet"), lease, redisTokens)
	}
}

// A fleet of new processes, Redis 2 ms away in each direction, default
// Options: none falls back, and together they make one bucket's retries
// (with a 5 ms Timeout every first call fell back: 175 retries for 5).
func TestColdStartOneHopAway(t *testing.T) {
	s := startRedis(t)
	proxy := startLatencyProxy(t, s.addr(), 2*time.Millisecond)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var retries, fallbacks atomic.Int64
	var wg sync.WaitGroup
	late := startLateness()
	for range 5 {
		rdb := redis.NewClient(&redis.Options{Addr: proxy.addr()})
		defer rdb.Close()
		b, err := New(Options{Client: rdb, Key: "fleet", OnFallback: func(err error) {
			if err != nil {
				fallbacks.Add(1)
				t.Logf("fell back: %v", err)
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		tr := &retryhttp.Transport{Budget: b, Policy: retryhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			OnAttempt: func(a retryhttp.Attempt) {
				if a.Decision == retryhttp.Retry {
					retries.Add(1)
				}
			}}
		defer tr.CloseIdleConnections()
		wg.Go(func() {
			for range 30 {
				req, _ := http.NewRequest("GET", srv.URL, nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	worst := late.Stop()
	if fallbacks.Load() != 0 && worst >= DefaultTimeout/2 {
		// The machine, not the budget: it paused the process for about as
		// long as the Timeout. A fallback then pays as documented.
		t.Logf("got %d fallbacks, %d retries while the machine paused goroutines for up to %v", fallbacks.Load(), retries.Load(), worst)
		return
	}
	if fallbacks.Load() != 0 || retries.Load() != DefaultCapacity/retryhttp.RetryCost {
		t.Errorf("got %d fallbacks, %d retries (the machine late by up to %v); want 0, %d (one bucket)", fallbacks.Load(), retries.Load(), worst, DefaultCapacity/retryhttp.RetryCost)
	}
}

// waitFor polls cond for up to 5 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// A withdrawal that waits for a stalled Redis holds the request past its
// own deadline (Policy.Timeout, or the caller's context): Budget's
// Withdraw takes no context, and weigh checks the deadline before it, not
// after. The Transport promises to keep every attempt and wait inside one
// deadline.
func TestWithdrawEndsWithTheRequest(t *testing.T) {
	const budgetTimeout = time.Second
	for _, tc := range []struct {
		name    string
		policy  time.Duration // Policy.Timeout
		cancel  time.Duration // the caller cancels after this, if positive
		allowed time.Duration // the most RoundTrip may take
	}{
		{"Policy.Timeout", 200 * time.Millisecond, 0, 400 * time.Millisecond},
		{"caller cancels", 0, 100 * time.Millisecond, 300 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startRedis(t)
			b := newBudget(t, s.client(), "fleet", func(o *Options) { o.Timeout = budgetTimeout })
			b.Withdraw(context.Background(), retryhttp.Transient)
			b.Withdraw(context.Background(), retryhttp.Transient) // the lease is spent: the next retry asks Redis
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusServiceUnavailable)
			}))
			defer srv.Close()
			tr := &retryhttp.Transport{Budget: b, Policy: retryhttp.Policy{BaseDelay: time.Millisecond, Timeout: tc.policy}}
			defer tr.CloseIdleConnections()
			s.pause()
			defer s.resume()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tc.cancel > 0 {
				time.AfterFunc(tc.cancel, cancel)
			}
			req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
			start := time.Now()
			resp, err := tr.RoundTrip(req)
			took := time.Since(start)
			if err == nil {
				resp.Body.Close()
			}
			if took > tc.allowed {
				t.Errorf("RoundTrip took %v (err %v); want at most %v: the budget's %v wait for Redis ran past the request's deadline",
					took.Round(time.Millisecond), err, tc.allowed, budgetTimeout)
			}
		})
	}
}

// Killing Redis while a call is out: the retry is paid by the fallback
// within the Timeout, the response comes back, and the call's deposits are
// dropped (their fate is unknown), not credited twice. (Held.)
func TestRedisKilledMidCall(t *testing.T) {
	s := startRedis(t)
	var fell atomic.Int32
	b := newBudget(t, s.client(), "fleet", func(o *Options) {
		o.Timeout = 300 * time.Millisecond
		o.OnFallback = func(err error) {
			if err != nil {
				fell.Add(1)
			}
		}
	})
	b.Withdraw(context.Background(), retryhttp.Transient)
	b.Withdraw(context.Background(), retryhttp.Transient)
	s.pause()
	proc := s.cmd.Process
	time.AfterFunc(50*time.Millisecond, func() { proc.Kill() }) // SIGKILL while the call waits
	start := time.Now()
	tk, ok := b.Withdraw(context.Background(), retryhttp.Transient)
	if took := time.Since(start); !ok || took > 400*time.Millisecond {
		t.Errorf("got ok %v after %v; want a fallback payment within about the Timeout", ok, took)
	}
	if tk == nil || fromLease(b, tk) || fell.Load() != 1 {
		t.Errorf("got lease refund %v, %d fallbacks; want the fallback's, 1", fromLease(b, tk), fell.Load())
	}
}

// OnFallback runs on the budget's own goroutine (the call's, or its
// timer's): a hook that panics there cannot be recovered by the caller of
// Withdraw, and takes the whole process down. Run in a child process.
func TestPanickingOnFallbackIsRecovered(t *testing.T) {
	if os.Getenv("REDISBUDGET_ONFALLBACK_CHILD") == "1" {
		s := startRedis(t)
		b := newBudget(t, s.client(), "fleet", func(o *Options) {
			o.Timeout = 50 * time.Millisecond
			o.OnFallback = func(error) { panic("hook") }
		})
		s.stop()
		func() {
			defer func() { recover() }() // the caller guards its own goroutine
			b.Withdraw(context.Background(), retryhttp.Transient)
		}()
		time.Sleep(200 * time.Millisecond)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestPanickingOnFallbackIsRecovered$")
	cmd.Env = append(os.Environ(), "REDISBUDGET_ONFALLBACK_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("a panicking OnFallback crashed the process (%v), though the caller recovered around Withdraw; want the panic recovered (and logged) or reported to the caller:\n%.300s", err, out)
	}
}

// While Redis is down, the fallback pays, through Withdraw, which takes no
// context: a Fallback whose Withdraw waits too (a second fleet
// budget, in another region say) holds the request up to its own Timeout,
// past the request's deadline, which Withdraw promises not to do.
func TestFallbackWithdrawalEndsWithTheContext(t *testing.T) {
	primary, secondary := startRedis(t), startRedis(t)
	fb := newBudget(t, secondary.client(), "fleet", func(o *Options) { o.Timeout = time.Second })
	<-fb.warmed
	b := newBudget(t, primary.client(), "fleet", func(o *Options) { o.Timeout = time.Second; o.Fallback = fb })
	<-b.warmed
	primary.stop() // the budget falls back
	if tk, ok := b.Withdraw(context.Background(), retryhttp.Transient); ok {
		tk(false)
	}
	if down, _ := b.Fallback(); !down {
		t.Fatal("the budget did not fall back")
	}
	for fb.lease.Load() >= retryhttp.RetryCost { // the fallback's lease is spent
		fb.takeLease(retryhttp.RetryCost)
	}
	secondary.pause() // the fallback's store stalls
	defer secondary.resume()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	tk, ok := b.Withdraw(ctx, retryhttp.Transient)
	took := time.Since(start)
	if ok {
		tk(false)
	}
	t.Logf("took %v ok %v from lease %v primary %+v fb %+v", took, ok, fromLease(b, tk), b.Stats(), fb.Stats())
	if took > 400*time.Millisecond {
		t.Errorf("Withdraw took %v (ok %v); want it to end with its context (100ms), not wait the fallback's 1s Timeout",
			took.Round(time.Millisecond), ok)
	}
}

// "When ctx ends before the budget decides, it refuses and holds nothing":
// a context that has already ended is paid from the lease, and an empty
// lease sends a call to Redis for a request that is gone.
func TestDoneContextRefuses(t *testing.T) {
	s := startRedis(t)
	b := newBudget(t, s.client(), "fleet")
	tk, ok := b.Withdraw(context.Background(), retryhttp.Transient) // fills the lease (28), pays 14
	if !ok {
		t.Fatal("first withdrawal refused")
	}
	tk(false)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if tk, ok := b.Withdraw(ctx, retryhttp.Transient); ok {
		tk(false)
		t.Errorf("lease: got ok with a context already done; want a refusal")
	}
	for b.lease.Load() >= retryhttp.RetryCost { // empty the lease
		b.takeLease(retryhttp.RetryCost)
	}
	calls := b.Stats().Calls
	if _, ok := b.Withdraw(ctx, retryhttp.Transient); ok {
		t.Errorf("empty lease: got ok with a context already done; want a refusal")
	}
	if got := b.Stats().Calls; got != calls {
		t.Errorf("got %d calls to Redis for a withdrawal whose context had ended; want none", got-calls)
	}
}

// Held: many withdrawals canceled at random while calls to a slow Redis are
// out lose no tokens and leave no waiting count behind: once every call
// has landed, the lease holds everything taken from the bucket (each
// payment is refunded), and waiting is zero.
func TestCanceledWithdrawalsConserveTokens(t *testing.T) {
	s := startRedis(t)
	p := startLatencyProxy(t, s.addr(), 20*time.Millisecond)
	rdb := redis.NewClient(&redis.Options{Addr: p.addr(), MaxRetries: -1, ReadTimeout: 2 * time.Second, ContextTimeoutEnabled: true})
	defer rdb.Close()
	b := newBudget(t, rdb, "fleet", func(o *Options) { o.Timeout = 300 * time.Millisecond; o.Capacity = 1 << 20; o.Lease = 14 })
	<-b.warmed
	var wg sync.WaitGroup
	for g := range 64 {
		wg.Go(func() {
			for i := range 20 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(30))*time.Millisecond)
				c := retryhttp.Transient
				if (g+i)%3 == 0 {
					c = retryhttp.Throttling
				}
				tk, ok := b.Withdraw(ctx, c)
				cancel()
				if ok && tk != nil {
					tk(false)
				}
			}
		})
	}
	wg.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for b.out.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	st := b.Stats()
	if st.FallbackPayments > 0 || st.Failures > 0 {
		t.Skipf("the budget fell back (%+v): the check needs every call answered", st)
	}
	b.mu.Lock()
	waiting := b.waiting
	b.mu.Unlock()
	if got := b.lease.Load(); got != st.Taken || waiting != 0 {
		t.Errorf("got lease %d, waiting %d; want lease %d (taken), waiting 0", got, waiting, st.Taken)
	}
}

// Held: with PerHost, a fleet budget per destination still ends a stalled
// withdrawal with the request's context.
func TestPerHostWithdrawEndsWithTheRequest(t *testing.T) {
	s := startRedis(t)
	rdb := s.client()
	var mu sync.Mutex
	var budgets []*Budget
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	tr := &retryhttp.Transport{
		PerHost: &retryhttp.PerHost{Budget: func(dest string) retryhttp.Budget {
			b := newBudget(t, rdb, "rb:"+dest, func(o *Options) { o.Timeout = time.Second; o.Lease = 14 })
			mu.Lock()
			budgets = append(budgets, b)
			mu.Unlock()
			return b
		}},
		Policy: retryhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond, MaxAttempts: 10, Timeout: 200 * time.Millisecond},
	}
	defer tr.CloseIdleConnections()
	// The first request makes the budget and spends its lease.
	req, _ := http.NewRequest("GET", srv.URL, nil)
	if resp, err := tr.RoundTrip(req); err == nil {
		resp.Body.Close()
	}
	s.pause()
	defer s.resume()
	start := time.Now()
	req, _ = http.NewRequest("GET", srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	if took := time.Since(start); took > 450*time.Millisecond {
		t.Errorf("RoundTrip took %v; want it to end with its 200ms Policy.Timeout", took)
	}
}
