package redisbudget

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// The chaos test's knobs: CI runs the short default; lab/fleet-chaos.sh a long one
// that writes its figures for docs/fleet.md.
var (
	chaosDuration  = flag.Duration("chaos.duration", 3*time.Second, "how long TestChaos drives traffic")
	chaosSeeds     = flag.String("chaos.seeds", "1", "TestChaos's seeds, comma-separated: one run each (the faults' schedule)")
	chaosProcesses = flag.Int("chaos.processes", 6, "TestChaos's processes (a Budget, a go-redis client and a Transport each)")
	chaosJSON      = flag.String("chaos.json", "", "if set, TestChaos writes its figures to this file")
)

// meter wraps a process's Budget to see what the Transport sees: how long
// each withdrawal took, who paid, and the refunds (to the payer that paid).
type meter struct {
	b                          *Budget
	leasePaid, leaseRefunded   atomic.Int64 // tokens
	fbPaid, fbRefunded         atomic.Int64 // tokens
	retries, refusals          atomic.Int64 // withdrawals
	hedges                     atomic.Int64 // hedged copies sent
	worst                      atomic.Int64 // ns, the slowest withdrawal
	late                       atomic.Int64 // withdrawals over Timeout + 20 ms
	fallbacks                  atomic.Int64 // OnFallback reports of a failure
	fallbackDeposits, requests atomic.Int64
}

func (m *meter) Deposit(success bool) { m.b.Deposit(success) }
func (m *meter) Available() int       { return m.b.Available() }
func (m *meter) Fallback() (bool, error) {
	return m.b.Fallback()
}

func (m *meter) Withdraw(ctx context.Context, c retryhttp.Class) (func(bool), bool) {
	start := time.Now()
	refund, ok := m.b.Withdraw(ctx, c)
	d := int64(time.Since(start))
	for w := m.worst.Load(); d > w && !m.worst.CompareAndSwap(w, d); w = m.worst.Load() {
	}
	if time.Duration(d) > m.b.opts.Timeout+20*time.Millisecond {
		m.late.Add(1)
	}
	if !ok {
		m.refusals.Add(1)
		return refund, false
	}
	m.retries.Add(1)
	paid, lease := cost(c), fromLease(m.b, refund)
	if lease {
		m.leasePaid.Add(paid)
	} else {
		m.fbPaid.Add(paid)
	}
	return func(sent bool) {
		if lease {
			m.leaseRefunded.Add(paid)
		} else {
			m.fbRefunded.Add(paid)
		}
		refund(sent)
	}, true
}

// countingFallback is a process's fallback bucket, counting the deposits it
// gets (its allowance grows by them).
type countingFallback struct {
	retryhttp.Budget
	m *meter
}

func (f countingFallback) Deposit(success bool) {
	if success {
		f.m.fallbackDeposits.Add(1)
	}
	f.Budget.Deposit(success)
}

// chaosFigures is what TestChaos measured and checked.
type chaosFigures struct {
	Redis     string  `json:"redis"` // "one node" or "cluster"
	Seed      uint64  `json:"seed"`
	Seconds   float64 `json:"seconds"`
	Processes int     `json:"processes"`
	Requests  int64   `json:"requests"`
	// The faults injected on the node that serves the bucket: SIGSTOP and
	// SIGCONT; kill -9 and restart; CLIENT KILL while the node is busy, so
	// that the scripts queued behind lose their replies and go-redis sends
	// them again; CLUSTER FAILOVER to the replica.
	Pauses      int   `json:"pauses"`
	Kills       int   `json:"kills"`
	ClientKills int   `json:"client_kills"`
	ConnsKilled int64 `json:"connections_killed"`
	Failovers   int   `json:"failovers"`
	// Calls Redis had applied already that came again, and changed
	// nothing (the bucket's replayed count, read before each kill): the
	// client's resends, its redirects, late runs.
	Replayed         int64 `json:"replayed_calls"`
	FallbackEpisodes int64 `json:"fallback_episodes"`
	Retries          int64 `json:"retries"`
	Hedges           int64 `json:"hedges"`
	// Tokens kept spent (paid minus refunded), by payer, against the bound.
	SpentFleet    int64 `json:"spent_fleet_tokens"`
	SpentFallback int64 `json:"spent_fallback_tokens"`
	Taken         int64 `json:"taken_tokens"`
	// The buckets: the first, one per kill -9 (the test's Redis keeps no
	// data, and a replica promoted may lack the last writes).
	Buckets       int     `json:"buckets"`
	Credited      int64   `json:"deposits_credited"`
	Unknown       int64   `json:"deposits_unknown"` // sent before a bucket was lost, never confirmed
	FleetBound    int64   `json:"fleet_bound_tokens"`
	FallbackBound int64   `json:"fallback_bound_tokens"`
	Spent         int64   `json:"spent_tokens"` // fleet + fallback
	Bound         int64   `json:"bound_tokens"` // fleet + fallback
	WorstCallMS   float64 `json:"worst_call_ms"`
	Withdrawals   int64   `json:"withdrawals"`
	LateCalls     int64   `json:"calls_over_timeout_plus_20ms"`
	// The slowest wake-up of a goroutine that sleeps 10 ms in a loop
	// during the run, less the 10 ms: how late this machine ran goroutines.
	WorstOversleepMS float64 `json:"worst_oversleep_ms"`
	TimeoutMS        float64 `json:"timeout_ms"`
	RedisCalls       int64   `json:"redis_calls"`
	// The bucket's tokens and leased tokens at the end.
	EndInRedis [2]int64 `json:"end_tokens_and_leased"`
	// The tokens left in the buckets, read before each kill and at the
	// end: Taken + Left <= Capacity x B + D.
	Left          int64 `json:"tokens_left_in_buckets"`
	LocalRefusals int64 `json:"local_refusals"`
}

// TestChaos drives processes (hedges included) through Transports against
// a failing server, each with a go-redis client at its default settings
// (MaxRetries 3; half with ContextTimeoutEnabled), on one Redis and on a
// 3-master Redis Cluster with a replica each, while the test pauses and
// resumes, kills -9 and restarts the node serving the bucket, drops its
// connections between scripts and their replies (CLIENT KILL), and, on
// the Cluster, fails it over to its replica. Then it checks docs/fleet.md's
// invariant:
//
//	fleet tokens spent <= taken from Redis <= Capacity x buckets + deposits credited
//	fallback tokens spent <= for each process, its fallback's Capacity + the deposits it got
//
// (deposits credited: those Redis confirmed, and those of unknown fate in a
// bucket lost), that no withdrawal was held past about Timeout, and that
// nothing is left running.
func TestChaos(t *testing.T) {
	defer noLeaks(t, goleak.IgnoreCurrent())
	var runs []chaosFigures
	for _, f := range strings.Split(*chaosSeeds, ",") {
		seed, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("-chaos.seeds: %v", err)
		}
		for _, cluster := range []bool{false, true} {
			name := "one node"
			if cluster {
				name = "cluster"
			}
			t.Run(name+"/seed="+strconv.FormatUint(seed, 10), func(t *testing.T) { runs = append(runs, chaosRun(t, seed, cluster)) })
		}
	}
	t.Log("\n" + chaosTable(runs))
	if *chaosJSON != "" {
		out, _ := json.MarshalIndent(map[string]any{"runs": runs}, "", "  ")
		if err := os.WriteFile(*chaosJSON, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// chaosTable is the runs as docs/fleet.md's table.
func chaosTable(runs []chaosFigures) string {
	var b strings.Builder
	b.WriteString("| Redis | seed | pauses | kills | CLIENT KILLs (connections) | failovers | calls replayed (no-ops) | retries | tokens spent | bound | taken from Redis | Capacity × B + D |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d (%d) | %d | %d | %d | %d | %d | %d | %d |\n", r.Redis, r.Seed, r.Pauses, r.Kills,
			r.ClientKills, r.ConnsKilled, r.Failovers, r.Replayed, r.Retries, r.Spent, r.Bound, r.Taken, r.FleetBound)
	}
	return b.String()
}

// chaosRun is one seeded run of TestChaos.
func chaosRun(t *testing.T, seed uint64, cluster bool) chaosFigures {
	const timeout = 100 * time.Millisecond
	const key = "retry-budget:{fleet}"
	rng := rand.New(rand.NewPCG(seed, 17))
	fig := chaosFigures{Redis: "one node", Seed: seed, Processes: *chaosProcesses, TimeoutMS: float64(timeout) / 1e6}
	var single *redisServer
	var cl *redisCluster
	// serving is the node that serves the bucket now.
	serving := func() *redisServer { return single }
	if cluster {
		fig.Redis = "cluster"
		// A node timeout well above the pauses: a paused master is not
		// failed over behind the test's back.
		cl = startClusterOf(t, 1, 2000)
		serving = func() *redisServer {
			var n *redisServer
			waitFor(t, "a master for the bucket's slot", func() bool { n = cl.serving(key); return n != nil })
			return n
		}
	} else {
		single = startRedis(t)
	}
	// The calls the bucket saw again, read before a kill loses them.
	// The tokens a bucket holds (a missing one is full), read before a
	// kill and at the end: no process got them.
	tokensIn := func(n *redisServer) int64 {
		rdb := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
		defer rdb.Close()
		v, err := rdb.HGet(context.Background(), key, "tokens").Int64()
		if errors.Is(err, redis.Nil) {
			return DefaultCapacity
		}
		if err != nil {
			t.Fatalf("HGET tokens: %v", err)
		}
		return v
	}
	replayed := func(n *redisServer) int64 {
		rdb := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
		defer rdb.Close()
		v, _ := rdb.HGet(context.Background(), key, "replayed").Int64()
		return v
	}

	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Mostly down; some answers slow (hedged), some successes (deposits
		// and refunds).
		switch n := rand.N(100); {
		case n < 10:
			return
		case n < 25:
			time.Sleep(3 * time.Millisecond)
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()

	meters := make([]*meter, *chaosProcesses)
	budgets := make([]*Budget, *chaosProcesses)
	var clients []redis.UniversalClient
	var trs []*retryhttp.Transport
	for i := range meters {
		m := &meter{}
		// go-redis's defaults, half with the context timeout on.
		var rdb redis.UniversalClient
		if cluster {
			var addrs []string
			for _, n := range cl.nodes {
				addrs = append(addrs, n.addr())
			}
			rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: i%2 == 0})
		} else {
			rdb = redis.NewClient(&redis.Options{Addr: single.addr(), ContextTimeoutEnabled: i%2 == 0})
		}
		clients = append(clients, rdb)
		b, err := New(Options{Client: rdb, Key: key, Timeout: timeout, RetryAfter: 200 * time.Millisecond,
			Recheck: 200 * time.Millisecond, Fallback: countingFallback{retryhttp.NewTokenBucket(DefaultCapacity), m},
			OnFallback: func(err error) {
				if err != nil {
					m.fallbacks.Add(1)
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		m.b = b
		meters[i], budgets[i] = m, b
		trs = append(trs, &retryhttp.Transport{Budget: m, Policy: retryhttp.Policy{BaseDelay: time.Millisecond,
			MaxDelay: 2 * time.Millisecond, HedgeDelay: time.Millisecond, HedgeRatio: 1},
			OnAttempt: func(a retryhttp.Attempt) { m.hedges.Add(int64(a.Hedges)) }}) // hedges are not paid from the budget
	}

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, tr := range trs {
		for range 2 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					meters[i].requests.Add(1)
					req, _ := http.NewRequest("GET", srv.URL, nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
					}
					time.Sleep(5 * time.Millisecond)
				}
			})
		}
	}

	// How late the machine wakes goroutines, for the worst call time.
	var oversleep atomic.Int64
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			t0 := time.Now()
			time.Sleep(10 * time.Millisecond)
			if d := int64(time.Since(t0) - 10*time.Millisecond); d > oversleep.Load() {
				oversleep.Store(d)
			}
		}
	})

	// The faults, from outside the library, on the serving node's own pid.
	// Each kind comes once first, in an order drawn from the seed, then at
	// random.
	const (
		pause = iota
		kill
		clientKill
		failover
		none
	)
	kinds := []int{pause, kill, clientKill}
	if cluster {
		kinds = append(kinds, failover)
	}
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	begin := time.Now()
	for n := 0; n < len(kinds) || time.Since(begin) < *chaosDuration; n++ {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		kind := none
		if n < len(kinds) {
			kind = kinds[n]
		} else {
			switch x := rng.IntN(100); {
			case x < 30:
				kind = pause
			case x < 45:
				kind = kill
			case x < 70:
				kind = clientKill
			case x < 85 && cluster:
				kind = failover
			}
		}
		node := serving()
		switch kind {
		case pause:
			fig.Pauses++
			node.pause()
			time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond)
			node.resume()
		case kill:
			fig.Kills++
			fig.Replayed += replayed(node)
			fig.Left += tokensIn(node)
			node.cmd.Process.Kill() // kill -9
			node.cmd.Wait()
			node.cmd = nil
			if cluster {
				// Its replica takes over, after the node timeout; then it
				// comes back, a replica.
				waitForLong(t, 20*time.Second, "the replica promoted", func() bool { return cl.serving(key) != nil })
			} else {
				time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond)
			}
			node.start()
			if cluster {
				cl.waitOK()
				waitForLong(t, 20*time.Second, "the restarted node a replica in sync", func() bool { return cl.replicaOf(serving()) != nil })
			}
		case clientKill:
			// The node busy for 100 ms: scripts that arrive meanwhile run,
			// and CLIENT KILL, queued behind them, drops their connections
			// before their replies go out.
			fig.ClientKills++
			sleeper, killer := dialRaw(t, node.addr()), dialRaw(t, node.addr())
			sleeper.send(t, "DEBUG", "SLEEP", "0.1")
			time.Sleep(50 * time.Millisecond)
			killer.send(t, "CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes")
			if line := killer.line(t); strings.HasPrefix(line, ":") {
				n, _ := strconv.ParseInt(line[1:], 10, 64)
				fig.ConnsKilled += n - 1 // the sleeper's own
			}
			sleeper.c.Close()
			killer.c.Close()
		case failover:
			// A manual failover: the replica catches up with its master,
			// then takes over. Redis gives one up after a few seconds if
			// the replica cannot catch up (its link just back, say): the
			// test asks again, and counts those that happened.
			for range 3 {
				replica := cl.replicaOf(node)
				if replica == nil {
					break
				}
				rdb := redis.NewClient(&redis.Options{Addr: replica.addr(), MaxRetries: -1})
				err := rdb.Do(context.Background(), "CLUSTER", "FAILOVER").Err()
				rdb.Close()
				if err != nil {
					t.Logf("CLUSTER FAILOVER: %v", err)
					continue
				}
				deadline := time.Now().Add(8 * time.Second)
				for cl.serving(key) != replica && time.Now().Before(deadline) {
					time.Sleep(10 * time.Millisecond)
				}
				if cl.serving(key) == replica {
					fig.Failovers++
					break
				}
			}
		}
	}
	close(stop)
	wg.Wait()
	fig.Seconds = time.Since(begin).Seconds()
	// Every call's goroutine has ended: go-redis's read timeouts and
	// resends may hold one for seconds after a pause.
	waitForLong(t, 60*time.Second, "the calls still out", func() bool {
		for _, b := range budgets {
			if b.out.Load() != 0 {
				return false
			}
		}
		return true
	})
	for _, tr := range trs {
		tr.CloseIdleConnections()
	}
	for _, c := range clients {
		c.Close()
	}
	// The bucket at the end: its tokens and the leases it counts stay
	// within the capacity.
	last := serving()
	fig.Replayed += replayed(last)
	fig.Left += tokensIn(last)
	admin := redis.NewClient(&redis.Options{Addr: last.addr(), MaxRetries: -1})
	held, err := admin.HMGet(context.Background(), key, "tokens", "leased").Result()
	admin.Close()
	if err != nil {
		t.Fatal(err)
	}
	for i, v := range held {
		if v != nil {
			n, _ := strconv.ParseInt(v.(string), 10, 64)
			fig.EndInRedis[i] = n
		}
	}
	if sum := fig.EndInRedis[0] + fig.EndInRedis[1]; sum > DefaultCapacity {
		t.Errorf("at the end the bucket holds %d tokens and counts %d in leases: %d; want at most %d", fig.EndInRedis[0], fig.EndInRedis[1], sum, DefaultCapacity)
	}

	fig.Buckets = 1 + fig.Kills
	for i, m := range meters {
		b, st := budgets[i], budgets[i].Stats()
		spentLease := m.leasePaid.Load() - m.leaseRefunded.Load()
		// What the lease paid and still holds is exactly what it took.
		if spentLease+int64(b.Available()) != st.Taken && !b.down.Load() {
			t.Errorf("process %d: %d tokens spent from the lease + %d left = %d; want %d, taken from Redis",
				i, spentLease, b.lease.Load(), spentLease+b.lease.Load(), st.Taken)
		}
		fig.SpentFleet += spentLease
		fig.SpentFallback += m.fbPaid.Load() - m.fbRefunded.Load()
		fig.Taken += st.Taken
		fig.Credited += st.Credited
		fig.Unknown += st.Dropped
		fig.FallbackBound += DefaultCapacity + m.fallbackDeposits.Load()
		fig.FallbackEpisodes += m.fallbacks.Load()
		fig.Retries += m.retries.Load()
		fig.Hedges += m.hedges.Load()
		fig.Requests += m.requests.Load()
		fig.WorstCallMS = max(fig.WorstCallMS, float64(m.worst.Load())/1e6)
		fig.RedisCalls += st.Calls
		fig.LateCalls += m.late.Load()
		fig.Withdrawals += m.retries.Load() + m.refusals.Load()
		fig.LocalRefusals += st.LocalRefusals
	}
	fig.WorstOversleepMS = float64(oversleep.Load()) / 1e6
	fig.FleetBound = DefaultCapacity*int64(fig.Buckets) + fig.Credited + fig.Unknown
	fig.Spent, fig.Bound = fig.SpentFleet+fig.SpentFallback, fig.FleetBound+fig.FallbackBound
	t.Logf("%+v", fig)
	if fig.SpentFleet > fig.Taken || fig.Taken > fig.FleetBound {
		t.Errorf("fleet tokens spent %d, taken from Redis %d; want spent <= taken <= %d (%d buckets of %d + %d deposits credited + %d of unknown fate)",
			fig.SpentFleet, fig.Taken, fig.FleetBound, fig.Buckets, DefaultCapacity, fig.Credited, fig.Unknown)
	}
	// Sharper: every grant came from a bucket's tokens, which start at
	// Capacity and only deposits refill, each once; the tokens left in each
	// bucket reached no process.
	if fig.Taken+fig.Left > fig.FleetBound {
		t.Errorf("taken from Redis %d + left in the buckets %d = %d; want at most %d: deposits credited more than once",
			fig.Taken, fig.Left, fig.Taken+fig.Left, fig.FleetBound)
	}
	if fig.SpentFallback > fig.FallbackBound {
		t.Errorf("spent from the fallbacks: %d tokens; want at most %d", fig.SpentFallback, fig.FallbackBound)
	}
	// About Timeout: 100 ms of slack, plus however late the machine woke a
	// sleeping goroutine during the run (a shared CI machine can be late
	// by more than a Timeout; the budget cannot be faster than that).
	if fig.WorstCallMS > fig.TimeoutMS+100+fig.WorstOversleepMS {
		t.Errorf("the slowest withdrawal took %.1f ms; want about the %.0f ms Timeout (the machine was late by up to %.1f ms)",
			fig.WorstCallMS, fig.TimeoutMS, fig.WorstOversleepMS)
	}
	if fig.Pauses == 0 || fig.Kills == 0 || fig.ClientKills == 0 || (cluster && fig.Failovers == 0) || fig.FallbackEpisodes == 0 || fig.Hedges == 0 {
		t.Errorf("the run saw %d pauses, %d kills, %d CLIENT KILLs, %d failovers, %d fallbacks, %d hedges; want some of each",
			fig.Pauses, fig.Kills, fig.ClientKills, fig.Failovers, fig.FallbackEpisodes, fig.Hedges)
	}
	return fig
}

// noLeaks fails t if goroutines other than those before are left after
// 10 s: go-redis's pool, after a failed dial, waits a second between
// tries before it sees its client closed, longer than goleak.VerifyNone
// waits.
func noLeaks(t *testing.T, before goleak.Option) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := goleak.Find(before)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Error(err)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitForLong polls cond for up to d.
func waitForLong(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
