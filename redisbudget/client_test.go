package redisbudget

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
)

// go-redis's own behaviour against the budget's accounting: it sends a
// command again after a network error or a read timeout (MaxRetries, 3 by
// default), which ran the script twice and credited its deposits twice
// before each call carried a sequence number; and with ContextTimeoutEnabled
// it drops a connection whose context ended, which lost a late answer and
// the tokens Redis granted for it, before the next answer carried the
// process's granted total. Each test runs with every setting.

// clientSettings are the go-redis settings each test runs with: the
// defaults, the context timeout on, and no retries (what fleet.md used to
// ask for).
var clientSettings = []struct {
	name string
	set  func(*redis.UniversalOptions)
}{
	{"defaults", func(*redis.UniversalOptions) {}},
	{"context timeout on", func(o *redis.UniversalOptions) { o.ContextTimeoutEnabled = true }},
	{"MaxRetries -1", func(o *redis.UniversalOptions) { o.MaxRetries = -1 }},
}

// eachClient runs f once for each of clientSettings; client makes a
// go-redis client of those settings from o, closed at the end.
func eachClient(t *testing.T, f func(t *testing.T, client func(o redis.UniversalOptions) redis.UniversalClient)) {
	for _, cs := range clientSettings {
		t.Run(cs.name, func(t *testing.T) {
			f(t, func(o redis.UniversalOptions) redis.UniversalClient {
				cs.set(&o)
				rdb := redis.NewUniversalClient(&o)
				t.Cleanup(func() { rdb.Close() })
				return rdb
			})
		})
	}
}

// rawConn is a plain RESP connection of the test's own to the server: what
// an operator's redis-cli session is.
type rawConn struct {
	c  net.Conn
	rd *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	r := &rawConn{c: c, rd: bufio.NewReader(c)}
	r.send(t, "PING")
	if line := r.line(t); line != "+PONG" {
		t.Fatalf("PING: got %q", line)
	}
	return r
}

// send writes one command and does not wait for its answer.
func (r *rawConn) send(t *testing.T, args ...string) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := r.c.Write([]byte(b.String())); err != nil {
		t.Fatal(err)
	}
}

func (r *rawConn) line(t *testing.T) string {
	t.Helper()
	r.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	s, err := r.rd.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(s, "\r\n")
}

// spendLeaseWith50Deposits leaves b with an empty lease, 50 deposits pending, and the
// bucket at 72 (100 - the lease of 28), as TestDepositsCreditedOnceAfterATimeout
// does.
func spendLeaseWith50Deposits(t *testing.T, s *redisServer, b *Budget) {
	t.Helper()
	b.Withdraw(context.Background(), retryhttp.Transient) // leases 28: 72 left
	for range 50 {
		b.Deposit(true)
	}
	b.Withdraw(context.Background(), retryhttp.Transient) // the lease is spent
	if st := b.Stats(); st.Calls != 1 || st.Failures != 0 || s.tokens("fleet") != 72 {
		t.Fatalf("setup: got %+v, %d in Redis; want one call, no failure, 72", st, s.tokens("fleet"))
	}
}

// An operator drops the clients' connections (CLIENT KILL TYPE normal)
// just after Redis ran the budget's script and before its answer went out:
// the client may send the script again, and the 50 deposits are credited
// once (with go-redis's default MaxRetries, 3, they were credited twice
// before calls carried a sequence number).
func TestDepositsCreditedOnceWhenTheConnectionDropsAfterTheScript(t *testing.T) {
	eachClient(t, testCreditedOnceAfterClientKill)
}

func testCreditedOnceAfterClientKill(t *testing.T, client func(redis.UniversalOptions) redis.UniversalClient) {
	s := startRedis(t)
	rdb := client(redis.UniversalOptions{Addrs: []string{s.addr()}})
	s.client().HSet(context.Background(), "fleet", "tokens", 100)
	b, err := New(Options{Client: rdb, Key: "fleet", Recheck: time.Hour}) // no call carries deposits alone
	if err != nil {
		t.Fatal(err)
	}
	spendLeaseWith50Deposits(t, s, b)

	sleeper, killer := dialRaw(t, s.addr()), dialRaw(t, s.addr())
	// Redis busy for 100 ms (a slow command, well under the 250 ms Timeout):
	// the budget's call and the operator's CLIENT KILL queue behind it, in
	// that order, and run in one turn of the event loop, before replies are
	// written.
	sleeper.send(t, "DEBUG", "SLEEP", "0.1")
	time.Sleep(20 * time.Millisecond)
	done := make(chan struct{})
	go func() {
		defer close(done)
		b.Withdraw(context.Background(), retryhttp.Transient) // carries the 50 deposits
	}()
	time.Sleep(30 * time.Millisecond)
	killer.send(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
	<-done
	if got := killer.line(t); !strings.HasPrefix(got, ":") {
		t.Fatalf("CLIENT KILL: got %q", got)
	}
	creditedOnce(t, s, b)
}

// Redis paused for 300 ms with a client whose ReadTimeout (200 ms) is under
// the budget's Timeout (1 s): the read times out, the client may send the
// script again, and the 50 deposits are credited once (with go-redis's
// default MaxRetries they were credited twice, Redis running both copies
// when it resumed, before calls carried a sequence number).
func TestDepositsCreditedOnceAfterAPauseWithAShortReadTimeout(t *testing.T) {
	eachClient(t, testCreditedOnceAfterAPause)
}

func testCreditedOnceAfterAPause(t *testing.T, client func(redis.UniversalOptions) redis.UniversalClient) {
	s := startRedis(t)
	rdb := client(redis.UniversalOptions{Addrs: []string{s.addr()}, ReadTimeout: 200 * time.Millisecond})
	s.client().HSet(context.Background(), "fleet", "tokens", 100)
	b, err := New(Options{Client: rdb, Key: "fleet", Timeout: time.Second, RetryAfter: 10 * time.Millisecond, Recheck: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	spendLeaseWith50Deposits(t, s, b)
	s.pause()
	time.AfterFunc(300*time.Millisecond, s.resume)
	b.Withdraw(context.Background(), retryhttp.Transient) // carries the 50 deposits
	time.Sleep(300 * time.Millisecond)
	waitFor(t, "the call to end", func() bool { return b.out.Load() == 0 })
	creditedOnce(t, s, b)
}

// creditedOnce checks Redis after spendLeaseWith50Deposits and a call that
// carried the 50 deposits: each may be credited once, and the bucket paid
// at least the batches that landed after the first: at most 72+50 less
// those.
func creditedOnce(t *testing.T, s *redisServer, b *Budget) {
	t.Helper()
	st := b.Stats()
	if most, tokens := 72+50-(st.Taken-28), s.tokens("fleet"); tokens > most {
		t.Errorf("Redis holds %d tokens; at most %d if the 50 deposits were credited at most once (the budget counts Credited %d, Dropped %d)",
			tokens, most, st.Credited, st.Dropped)
	}
}

// A fleet of 20 processes, each making one retry while Redis stalls for
// 400 ms, longer than the 250 ms Timeout (a fork on a large dataset): the
// fallbacks pay, and when Redis resumes and runs the 20 scripts, their
// late answers land in the leases, or the next answers bring their grants,
// so no token leaves the fleet's bucket without reaching a lease (with the
// client's context timeout on, every answer was lost with its connection,
// and 500 tokens with them, before answers carried the granted total).
func TestLateAnswersLandAfterAStall(t *testing.T) {
	eachClient(t, testLateAnswersLand)
}

func testLateAnswersLand(t *testing.T, client func(redis.UniversalOptions) redis.UniversalClient) {
	s := startRedis(t)
	const procs = 20
	var budgets []*Budget
	var spentFromLease atomic.Int64
	for range procs {
		rdb := client(redis.UniversalOptions{Addrs: []string{s.addr()}})
		b, err := New(Options{Client: rdb, Key: "fleet", RetryAfter: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		budgets = append(budgets, b)
	}
	// An idle fleet: no lease yet, a full bucket, connections open.
	for _, b := range budgets {
		<-b.warmed
	}
	s.pause()
	var wg sync.WaitGroup
	for _, b := range budgets {
		wg.Go(func() {
			tk, ok := b.Withdraw(context.Background(), retryhttp.Transient)
			if ok && fromLease(b, tk) {
				spentFromLease.Add(retryhttp.RetryCost)
			}
		})
	}
	wg.Wait()
	time.Sleep(150 * time.Millisecond) // 400 ms in all
	s.resume()
	waitFor(t, "the calls to end", func() bool {
		for _, b := range budgets {
			if b.out.Load() != 0 {
				return false
			}
		}
		return true
	})
	time.Sleep(100 * time.Millisecond) // past RetryAfter: back on Redis
	// One more retry for each process, now that Redis answers.
	paidAfter, refusedAfter := 0, 0
	for _, b := range budgets {
		tk, ok := b.Withdraw(context.Background(), retryhttp.Transient)
		if !ok {
			refusedAfter++
		} else if fromLease(b, tk) {
			spentFromLease.Add(retryhttp.RetryCost)
			paidAfter++
		}
	}
	var leased, taken int64
	for _, b := range budgets {
		leased += int64(b.lease.Load())
		taken += b.Stats().Taken
	}
	inRedis := s.tokens("fleet")
	if total := inRedis + leased + spentFromLease.Load(); total != DefaultCapacity {
		t.Errorf("Redis %d + leases %d + spent from leases %d = %d; want %d: %d tokens left the fleet's bucket and reached no lease",
			inRedis, leased, spentFromLease.Load(), total, DefaultCapacity, DefaultCapacity-total)
	}
}

// Redis out of memory (maxmemory tiny, noeviction: writes fail with OOM):
// the budget falls back within the Timeout, reports it once, keeps its
// deposits (Redis answered with an error: not applied) and credits them
// once when Redis has room again. Redis a read-only replica: same.
func TestRedisRefusingWrites(t *testing.T) {
	for _, tc := range []struct {
		name        string
		break_, fix func(t *testing.T, s *redisServer)
	}{
		{"OOM", func(t *testing.T, s *redisServer) {
			c := s.client()
			c.ConfigSet(context.Background(), "maxmemory-policy", "noeviction")
			c.ConfigSet(context.Background(), "maxmemory", "1")
		}, func(t *testing.T, s *redisServer) {
			s.client().ConfigSet(context.Background(), "maxmemory", "0")
		}},
		{"READONLY replica", func(t *testing.T, s *redisServer) {
			// A replica of a server that is not there: it stays a
			// read-only replica with its data.
			if err := s.client().Do(context.Background(), "REPLICAOF", "127.0.0.1", "1").Err(); err != nil {
				t.Fatal(err)
			}
		}, func(t *testing.T, s *redisServer) {
			if err := s.client().Do(context.Background(), "REPLICAOF", "NO", "ONE").Err(); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startRedis(t)
			var mu sync.Mutex
			var reports []error
			b := newBudget(t, s.client(), "fleet", func(o *Options) {
				o.RetryAfter = 5 * time.Millisecond
				o.Recheck = time.Hour
				o.OnFallback = func(err error) { mu.Lock(); reports = append(reports, err); mu.Unlock() }
			})
			s.client().HSet(context.Background(), "fleet", "tokens", 100)
			b.Withdraw(context.Background(), retryhttp.Transient) // 72 left
			for range 50 {
				b.Deposit(true)
			}
			b.Withdraw(context.Background(), retryhttp.Transient) // lease spent; 50 deposits pending
			tc.break_(t, s)
			for range 5 {
				start := time.Now()
				if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
					t.Fatal("refused; want the fallback to pay")
				}
				if d := time.Since(start); d > 300*time.Millisecond {
					t.Errorf("a withdrawal took %v; want within about the Timeout", d)
				}
				time.Sleep(10 * time.Millisecond)
			}
			down, why := b.Fallback()
			t.Logf("falling back: %v (%v)", down, why)
			if !down {
				t.Fatal("not falling back while Redis refuses writes")
			}
			tc.fix(t, s)
			time.Sleep(10 * time.Millisecond)
			for i := 0; ; i++ {
				b.Withdraw(context.Background(), retryhttp.Transient)
				if d, _ := b.Fallback(); !d {
					break
				}
				if i > 100 {
					t.Fatal("did not come back to Redis")
				}
				time.Sleep(10 * time.Millisecond)
			}
			st := b.Stats()
			mu.Lock()
			defer mu.Unlock()
			if len(reports) != 2 || reports[0] == nil || reports[1] != nil {
				t.Errorf("got reports %v; want [err, nil]", reports)
			}
			// 72 + 50 deposits credited once - the lease that landed.
			if got, want := s.tokens("fleet"), int64(72+50)-(st.Taken-28); got != want || st.Credited != 50 {
				t.Errorf("got %d in Redis, %d credited, %d dropped; want %d, 50, 0", got, st.Credited, st.Dropped, want)
			}
		})
	}
}

// A Redis URL with a password, wrong for the server (or the server down):
// the password appears nowhere in what the budget reports (OnFallback's
// error, Fallback(), the Logger).
func TestPasswordNeverReported(t *testing.T) {
	const secret = "s3cr3t-hunter2"
	for _, tc := range []struct {
		name string
		url  func(s *redisServer) string
	}{
		{"wrong password", func(s *redisServer) string { return "redis://default:" + secret + "@" + s.addr() + "/0" }},
		{"wrong user", func(s *redisServer) string { return "redis://nobody:" + secret + "@" + s.addr() + "/0" }},
		{"server down", func(s *redisServer) string { return "redis://:" + secret + "@127.0.0.1:1/0" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startRedis(t, "--requirepass", "the-right-one")
			opt, err := redis.ParseURL(tc.url(s))
			if err != nil {
				t.Fatal(err)
			}
			opt.ContextTimeoutEnabled = true
			rdb := redis.NewClient(opt)
			defer rdb.Close()
			var logBuf bytes.Buffer
			var mu sync.Mutex
			var reports []string
			b, err := New(Options{Client: rdb, Key: "fleet", RetryAfter: time.Millisecond,
				Logger:     slog.New(slog.NewTextHandler(&syncWriter{w: &logBuf, mu: &mu}, nil)),
				OnFallback: func(err error) { mu.Lock(); reports = append(reports, fmt.Sprint(err)); mu.Unlock() }})
			if err != nil {
				t.Fatal(err)
			}
			for range 3 {
				if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
					t.Fatal("refused; want the fallback to pay")
				}
				time.Sleep(3 * time.Millisecond)
			}
			_, why := b.Fallback()
			mu.Lock()
			all := logBuf.String() + strings.Join(reports, "\n") + fmt.Sprint(why)
			mu.Unlock()
			t.Logf("reported: %s", all)
			if why == nil {
				t.Error("not falling back")
			}
			if strings.Contains(all, secret) {
				t.Errorf("the password is in what the budget reported: %s", all)
			}
		})
	}
}

type syncWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// 150 Budgets in one process on one key (a fleet of 150, each with its own
// client), 3 goroutines each retrying until refused: the retries paid from
// leases are at most 35 (the bucket), and spent + leased + left in Redis is
