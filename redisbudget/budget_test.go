package redisbudget

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
)

func TestSharedBucket(t *testing.T) {
	s := startRedis(t)
	b1 := newBudget(t, s.client(), "fleet")
	b2 := newBudget(t, s.client(), "fleet")
	steps := []struct {
		name       string
		b          *Budget
		class      retryhttp.Class
		ok         bool
		lease      int
		redisAfter int64
	}{
		{"first retry leases 28, spends 14", b1, retryhttp.Transient, true, 14, 472},
		{"second retry spends the lease, no Redis call", b1, retryhttp.Transient, true, 0, 472},
		{"another process leases from the same bucket", b2, retryhttp.Throttling, true, 23, 444},
	}
	var paid func(bool)
	for _, st := range steps {
		tk, ok := st.b.Withdraw(context.Background(), st.class)
		cost := cost(st.class)
		if st.b == b1 && ok {
			paid = tk
		}
		if ok != st.ok || st.b.Available() != st.lease || s.tokens("fleet") != st.redisAfter {
			t.Errorf("%s: got ok %v (cost %d), lease %d, Redis %d; want %v, %d, %d",
				st.name, ok, cost, st.b.Available(), s.tokens("fleet"), st.ok, st.lease, st.redisAfter)
		}
	}
	// A successful retry's refund stays in the lease; deposits travel with
	// the next refill.
	paid(true)
	for range 10 {
		b1.Deposit(true)
	}
	b1.Withdraw(context.Background(), retryhttp.Transient) // paid by the refund: no Redis call
	if got := s.tokens("fleet"); got != 444 {
		t.Errorf("after a refund-paid retry: got %d in Redis; want 444", got)
	}
	b1.Withdraw(context.Background(), retryhttp.Transient) // refill: +10 deposits, -28
	if got := s.tokens("fleet"); got != 444+10-28 {
		t.Errorf("after a refill with 10 deposits: got %d in Redis; want %d", got, 444+10-28)
	}
}

func TestAtomicUnderConcurrency(t *testing.T) {
	// 5 clients (own connections, own Budget), 10 goroutines each, all
	// retrying until the fleet's bucket is empty: the tokens spent, the
	// tokens left in Redis and in leases add up to exactly 500.
	s := startRedis(t)
	var spent atomic.Int64
	var budgets []*Budget
	var wg sync.WaitGroup
	for range 5 {
		b := newBudget(t, s.client(), "fleet", func(o *Options) { o.Timeout = 2 * time.Second })
		budgets = append(budgets, b)
		for range 10 {
			wg.Go(func() {
				for {
					_, ok := b.Withdraw(context.Background(), retryhttp.Transient)
					if !ok {
						return
					}
					spent.Add(retryhttp.RetryCost)
				}
			})
		}
	}
	wg.Wait()
	leased := int64(0)
	for _, b := range budgets {
		if down, err := b.Fallback(); down {
			t.Fatalf("a budget fell back: %v", err)
		}
		leased += int64(b.Available())
	}
	if total := spent.Load() + leased + s.tokens("fleet"); total != DefaultCapacity {
		t.Errorf("got %d spent + %d leased + %d in Redis = %d; want %d", spent.Load(), leased, s.tokens("fleet"), total, DefaultCapacity)
	}
	if spent.Load() != 35*retryhttp.RetryCost {
		t.Errorf("got %d tokens spent; want %d (35 retries, the fleet's whole bucket)", spent.Load(), 35*retryhttp.RetryCost)
	}
}

func TestRedisRestart(t *testing.T) {
	s := startRedis(t)
	var changes []error
	b := newBudget(t, s.client(), "fleet", func(o *Options) {
		o.RetryAfter = 20 * time.Millisecond
		o.OnFallback = func(err error) { changes = append(changes, err) }
	})
	b.Withdraw(context.Background(), retryhttp.Transient)
	b.Withdraw(context.Background(), retryhttp.Transient) // the lease is spent
	s.restart()                                           // the bucket is gone with the data (no persistence)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
			t.Fatal("a retry was refused: the fallback or the new bucket should pay")
		}
		if down, _ := b.Fallback(); !down && s.client().Exists(context.Background(), "fleet").Val() == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the budget did not get back to Redis after the restart")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := s.tokens("fleet"); got > DefaultCapacity-DefaultLease || got < DefaultCapacity-3*DefaultLease {
		t.Errorf("got %d in the new bucket; want a fresh bucket less a lease or two", got)
	}
	for i := 1; i < len(changes); i++ {
		if (changes[i] == nil) == (changes[i-1] == nil) {
			t.Errorf("OnFallback calls %v: want alternating fallbacks and recoveries", changes)
		}
	}
}

func TestSlowRedisFallsBackWithinTheTimeout(t *testing.T) {
	s := startRedis(t)
	var fallbacks atomic.Int32
	b := newBudget(t, s.client(), "fleet", func(o *Options) {
		o.Timeout = 20 * time.Millisecond
		o.RetryAfter = 50 * time.Millisecond
		o.OnFallback = func(err error) {
			if err != nil {
				fallbacks.Add(1)
			}
		}
	})
	sleeper := s.client()
	sleeping := make(chan struct{})
	go func() {
		close(sleeping)
		sleeper.Do(context.Background(), "DEBUG", "SLEEP", "1")
	}()
	<-sleeping
	time.Sleep(20 * time.Millisecond) // the server is inside DEBUG SLEEP now
	var worst time.Duration
	for range 20 {
		start := time.Now()
		if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
			t.Fatal("a retry was refused; want the fallback to pay")
		}
		worst = max(worst, time.Since(start))
	}
	if worst > 200*time.Millisecond {
		t.Errorf("a withdrawal took %v; want about the 20ms Timeout", worst)
	}
	if down, err := b.Fallback(); !down || err == nil {
		t.Errorf("got fallback %v (%v); want true with the timeout", down, err)
	}
	if fallbacks.Load() != 1 {
		t.Errorf("got %d fallback reports; want 1", fallbacks.Load())
	}
	// After the sleep, the budget finds Redis again by itself.
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.Withdraw(context.Background(), retryhttp.Transient)
		if down, _ := b.Fallback(); !down {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the budget did not get back to Redis after DEBUG SLEEP")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestKeyExpiry(t *testing.T) {
	s := startRedis(t)
	b := newBudget(t, s.client(), "fleet", func(o *Options) { o.TTL = 100 * time.Millisecond })
	b.Withdraw(context.Background(), retryhttp.Transient)
	if s.tokens("fleet") != DefaultCapacity-DefaultLease {
		t.Fatalf("got %d; want %d", s.tokens("fleet"), DefaultCapacity-DefaultLease)
	}
	ttl := s.client().PTTL(context.Background(), "fleet").Val()
	if ttl <= 0 || ttl > 100*time.Millisecond {
		t.Errorf("got a TTL of %v; want at most 100ms", ttl)
	}
	time.Sleep(300 * time.Millisecond)
	if n := s.client().Exists(context.Background(), "fleet").Val(); n != 0 {
		t.Fatalf("the key still exists after its TTL")
	}
	b.Withdraw(context.Background(), retryhttp.Transient)
	b.Withdraw(context.Background(), retryhttp.Transient) // refill from a new, full bucket
	if got := s.tokens("fleet"); got != DefaultCapacity-DefaultLease {
		t.Errorf("got %d in the bucket after expiry; want a fresh one less a lease, %d", got, DefaultCapacity-DefaultLease)
	}
}

func TestFleetsAreIndependent(t *testing.T) {
	s := startRedis(t)
	a := newBudget(t, s.client(), "fleet:{a}")
	b := newBudget(t, s.client(), "fleet:{b}")
	for {
		if _, ok := a.Withdraw(context.Background(), retryhttp.Transient); !ok {
			break
		}
	}
	if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
		t.Error("fleet b was refused after fleet a drained its own bucket")
	}
	if got := s.tokens("fleet:{b}"); got != DefaultCapacity-DefaultLease {
		t.Errorf("fleet b's bucket: got %d; want %d", got, DefaultCapacity-DefaultLease)
	}
}

func TestBadDataFallsBack(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(rdb *redis.Client)
	}{
		{"wrong type", func(rdb *redis.Client) { rdb.Set(context.Background(), "fleet", "garbage", 0) }},
		{"not a number", func(rdb *redis.Client) { rdb.HSet(context.Background(), "fleet", "tokens", "lots") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startRedis(t)
			tc.setup(s.client())
			var reports []error
			b := newBudget(t, s.client(), "fleet", func(o *Options) {
				o.RetryAfter = time.Millisecond
				o.OnFallback = func(err error) { reports = append(reports, err) }
			})
			for range 20 {
				if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
					t.Fatal("a retry was refused; want the fallback to pay")
				}
				time.Sleep(2 * time.Millisecond) // past RetryAfter: Redis is tried again
			}
			if len(reports) != 1 || !errors.Is(reports[0], ErrBadData) {
				t.Errorf("got reports %v; want one, wrapping ErrBadData", reports)
			}
		})
	}
}

func TestThroughTheTransport(t *testing.T) {
	// Two Transports with their own Redis budgets on one key: together they
	// make the 35 retries of one bucket against a server that is down.
	s := startRedis(t)
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var trs []*retryhttp.Transport
	for range 2 {
		tr := &retryhttp.Transport{Budget: newBudget(t, s.client(), "fleet"),
			Policy: retryhttp.Policy{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond}}
		defer tr.CloseIdleConnections()
		trs = append(trs, tr)
	}
	for i := range 100 {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		resp, err := trs[i%2].RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
	}
	if got := calls.Load(); got != 100+35 {
		t.Errorf("got %d attempts for 100 requests from two processes; want 135 (35 retries for the fleet)", got)
	}
}

func TestTransportHookSeesTheFallback(t *testing.T) {
	s := startRedis(t)
	rdb := s.client()
	b := newBudget(t, rdb, "fleet", func(o *Options) { o.Timeout = 20 * time.Millisecond })
	s.stop() // Redis is gone before the first retry
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	var seen []retryhttp.Attempt
	tr := &retryhttp.Transport{Budget: b, Policy: retryhttp.Policy{BaseDelay: time.Microsecond},
		OnAttempt: func(a retryhttp.Attempt) { seen = append(seen, a) }}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if len(seen) != 3 || !strings.Contains(seen[0].String(), "(budget fallback)") || seen[0].Decision != retryhttp.Retry {
		t.Errorf("got attempts %v; want 3, the first a retry paid by the fallback (budget fallback)", seen)
	}
}

func TestShardKey(t *testing.T) {
	for _, tc := range []struct {
		key  string
		i    int
		want string
	}{
		{"retry-budget:{orders-api}", 2, "{retry-budget:(orders-api)#2}"},
		{"fleet", 0, "{fleet#0}"},
	} {
		if got := ShardKey(tc.key, tc.i); got != tc.want {
			t.Errorf("ShardKey(%q, %d): got %q; want %q", tc.key, tc.i, got, tc.want)
		}
	}
	if _, err := New(Options{Client: redis.NewClient(&redis.Options{}), Key: "k", Capacity: 40, Shards: 4}); err == nil {
		t.Error("4 shards of 10 tokens: got no error; want one (a shard cannot pay for a retry)")
	}
}

func TestPerHostFleetBudgets(t *testing.T) {
	// Two processes, each one Transport with PerHost, a fleet budget per
	// destination (one Redis key each): two dead hosts each get one bucket's
	// 35 retries for the fleet, and the keys are the destinations'.
	s := startRedis(t)
	var calls [2]atomic.Int64
	var srvs [2]*httptest.Server
	for i := range srvs {
		srvs[i] = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls[i].Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
		}))
		defer srvs[i].Close()
	}
	var keys sync.Map
	var trs []*retryhttp.Transport
	for range 2 {
		rdb := s.client()
		tr := &retryhttp.Transport{
			PerHost: &retryhttp.PerHost{Budget: func(dest string) retryhttp.Budget {
				keys.Store(dest, true)
				return newBudget(t, rdb, "retry-budget:"+dest)
			}},
			Policy: retryhttp.Policy{BaseDelay: time.Microsecond, MaxDelay: time.Microsecond},
		}
		defer tr.CloseIdleConnections()
		trs = append(trs, tr)
	}
	for i := range 200 {
		req, _ := http.NewRequest("GET", srvs[i%2].URL, nil)
		resp, err := trs[(i/2)%2].RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
	}
	for i := range srvs {
		if got := calls[i].Load(); got != 100+35 {
			t.Errorf("host %d: got %d attempts for 100 requests from two processes; want 135 (one bucket's 35 retries)", i, got)
		}
		dest := "http://" + srvs[i].Listener.Addr().String()
		if _, ok := keys.Load(dest); !ok {
			t.Errorf("no budget made for %s", dest)
		}
		if got := s.tokens("retry-budget:" + dest); got >= 14 {
			t.Errorf("%s: got %d tokens left in Redis; want less than a retry's cost", dest, got)
		}
	}
}

// A TTL under a millisecond is sent to PEXPIRE as 0, which deletes the
// bucket as soon as the script writes it: every call finds a full bucket,
// and the fleet's bound is gone. New must refuse such a TTL, or the bucket
// must outlive the call that wrote it.
func TestSubMillisecondTTLRefused(t *testing.T) {
	for _, ttl := range []time.Duration{500 * time.Microsecond, 100 /* ns: a unit forgotten */} {
		t.Run(ttl.String(), func(t *testing.T) {
			s := startRedis(t)
			if _, err := New(Options{Client: s.client(), Key: "fleet", TTL: ttl, Capacity: 2 * retryhttp.RetryCost}); err == nil {
				t.Fatalf("New with TTL %v: got no error; want one (PEXPIRE would get 0 and delete the bucket it writes)", ttl)
			}
		})
	}
}

// A Capacity beyond what Lua's doubles hold exactly (2^53) comes back from
// the script as an integer that wrapped: the budget then believes the
// bucket is empty and refuses retries locally, and counts no deposit.
func TestHugeCapacity(t *testing.T) {
	for _, capacity := range []int64{1 << 40, 1 << 62, math.MaxInt64} {
		t.Run(itoa(capacity), func(t *testing.T) {
			s := startRedis(t)
			b := newBudget(t, s.client(), "fleet", func(o *Options) { o.Capacity = capacity })
			for i := range 4 {
				if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
					t.Fatalf("Capacity %d: retry %d refused (seen %d); want every one paid from a bucket that large", capacity, i+1, b.seen.Load())
				}
			}
		})
	}
}

// A nil pointer as Fallback (a *Budget variable never set): the Transport
// reads a nil pointer in its Budget field as "none"; New keeps it, and the
// first withdrawal that falls back panics on it.
func TestTypedNilFallback(t *testing.T) {
	s := startRedis(t)
	var fb *Budget // not configured
	b := newBudget(t, s.client(), "fleet", func(o *Options) { o.Timeout = 50 * time.Millisecond; o.Fallback = fb })
	s.stop() // Redis is gone
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("Withdraw panicked with Redis down and a nil *Budget Fallback: %v; want the default fallback to pay", p)
		}
	}()
	if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
		t.Errorf("refused; want the default fallback (a private Budget of Capacity) to pay")
	}
	b.Deposit(true)
}

// fromLease reports whether refund is one of b's lease refunds, which give
// tokens back to the lease (the fallback's give them back to it).
func fromLease(b *Budget, refund func(bool)) bool {
	return refund != nil && (sameFunc(refund, b.refundRetry) || sameFunc(refund, b.refundThrottle))
}

// sameFunc reports whether f and g are the same func value.
func sameFunc(f, g func(bool)) bool {
	return *(*unsafe.Pointer)(unsafe.Pointer(&f)) == *(*unsafe.Pointer)(unsafe.Pointer(&g))
}
