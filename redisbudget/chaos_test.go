package redisbudget

import (
	"context"
	"encoding/json"
	"flag"
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

// The chaos test's knobs: CI runs the short default; chaos.sh a long one
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
	Seed             uint64  `json:"seed"`
	Seconds          float64 `json:"seconds"`
	Processes        int     `json:"processes"`
	Requests         int64   `json:"requests"`
	Pauses           int     `json:"pauses"`
	Kills            int     `json:"kills"`
	FallbackEpisodes int64   `json:"fallback_episodes"`
	Retries          int64   `json:"retries"`
	Hedges           int64   `json:"hedges"`
	// Tokens kept spent (paid minus refunded), by payer, against the bound.
	SpentFleet    int64   `json:"spent_fleet_tokens"`
	SpentFallback int64   `json:"spent_fallback_tokens"`
	Taken         int64   `json:"taken_tokens"`
	Buckets       int     `json:"buckets"` // the first, and one per restart
	DepositsSent  int64   `json:"deposits_sent"`
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
	LocalRefusals    int64   `json:"local_refusals"`
}

// TestChaos drives processes (hedges included) through Transports against
// a failing server while the test pauses, resumes, kills and restarts the
// redis-server at random, then checks the bound of docs/fleet.md:
//
//	fleet tokens spent    <= taken from Redis <= Capacity x buckets + deposits sent
//	fallback tokens spent <= for each process, its fallback's Capacity + the deposits it got
//
// (a bucket per restart: the test's Redis keeps no data), that no
// withdrawal was held past about Timeout, and that nothing is left running.
func TestChaos(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	var runs []chaosFigures
	for _, f := range strings.Split(*chaosSeeds, ",") {
		seed, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil {
			t.Fatalf("-chaos.seeds: %v", err)
		}
		t.Run("seed="+strconv.FormatUint(seed, 10), func(t *testing.T) { runs = append(runs, chaosRun(t, seed)) })
	}
	if *chaosJSON != "" {
		out, _ := json.MarshalIndent(map[string]any{"runs": runs}, "", "  ")
		if err := os.WriteFile(*chaosJSON, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// chaosRun is one seeded run of TestChaos.
func chaosRun(t *testing.T, seed uint64) chaosFigures {
	const timeout = 100 * time.Millisecond
	rng := rand.New(rand.NewPCG(seed, 17))
	s := startRedis(t)
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
	var clients []*redis.Client
	var trs []*retryhttp.Transport
	for i := range meters {
		m := &meter{}
		// Half the clients bound their calls by the context, half by their
		// read timeout (late answers).
		rdb := redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: i%2 == 0, ReadTimeout: 500 * time.Millisecond})
		clients = append(clients, rdb)
		b, err := New(Options{Client: rdb, Key: "fleet", Timeout: timeout, RetryAfter: 200 * time.Millisecond,
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

	// The faults, from outside the library, on the server's own pid.
	fig := chaosFigures{Seed: seed, Processes: *chaosProcesses, TimeoutMS: float64(timeout) / 1e6}
	begin := time.Now()
	for time.Since(begin) < *chaosDuration {
		time.Sleep(time.Duration(50+rng.IntN(250)) * time.Millisecond)
		switch n := rng.IntN(100); {
		case n < 40:
			fig.Pauses++
			s.pause()
			time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond)
			s.resume()
		case n < 65:
			fig.Kills++
			s.stop()
			time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond)
			s.start()
		}
	}
	close(stop)
	wg.Wait()
	fig.Seconds = time.Since(begin).Seconds()
	// Every call's goroutine has settled its tokens and deposits.
	waitFor(t, "the calls still out", func() bool {
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

	fig.Buckets = 1 + fig.Kills
	for i, m := range meters {
		b, st := budgets[i], budgets[i].Stats()
		spentLease := m.leasePaid.Load() - m.leaseRefunded.Load()
		// What the lease paid and still holds is exactly what it took.
		if spentLease+b.lease.Load() != st.Taken {
			t.Errorf("process %d: %d tokens spent from the lease + %d left = %d; want %d, taken from Redis",
				i, spentLease, b.lease.Load(), spentLease+b.lease.Load(), st.Taken)
		}
		fig.SpentFleet += spentLease
		fig.SpentFallback += m.fbPaid.Load() - m.fbRefunded.Load()
		fig.Taken += st.Taken
		fig.DepositsSent += st.Credited + st.Dropped
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
	fig.FleetBound = DefaultCapacity*int64(fig.Buckets) + fig.DepositsSent
	fig.Spent, fig.Bound = fig.SpentFleet+fig.SpentFallback, fig.FleetBound+fig.FallbackBound
	t.Logf("%+v", fig)
	if fig.Taken > fig.FleetBound {
		t.Errorf("taken from Redis: %d tokens; want at most %d (%d buckets of %d + %d deposits sent)",
			fig.Taken, fig.FleetBound, fig.Buckets, DefaultCapacity, fig.DepositsSent)
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
	if fig.Pauses+fig.Kills == 0 || fig.FallbackEpisodes == 0 || fig.Hedges == 0 {
		t.Errorf("the run saw %d pauses, %d kills, %d fallbacks, %d hedges; want some of each", fig.Pauses, fig.Kills, fig.FallbackEpisodes, fig.Hedges)
	}
	return fig
}
