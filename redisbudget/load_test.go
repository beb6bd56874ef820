package redisbudget

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/redis/go-redis/v9"
)

var loadJSON = flag.String("load.json", "", "if set, TestLoadModel measures the load model's matrix and writes it to this file (lab/fleet-load.sh)")

// outageRun is one measured outage: processes, each with its own go-redis
// client and Budget on one key, sending failing requests at rate each.
type outageRun struct {
	Processes int     `json:"processes"`
	Rate      float64 `json:"rate_per_process"`
	Transport bool    `json:"through_transports"` // else the Transport's budget calls, driven directly
	Seconds   float64 `json:"seconds"`
	Requests  int64   `json:"failing_requests"`
	Retries   int64   `json:"retries"`
	// From Redis's INFO commandstats, reset when the processes are connected
	// and the outage starts: every command (the commands the script runs
	// included), and the script calls (EVALSHA, EVAL).
	Commands    int64 `json:"commands"`
	ScriptCalls int64 `json:"script_calls"`
	// From the budgets' Stats: calls that failed or timed out, retries the
	// fallbacks paid for.
	Failures         int64 `json:"failures"`
	FallbackPayments int64 `json:"fallback_payments"`
	// The bucket's hash at the end: the process records in it (one per
	// process that called Redis within the TTL), and its size in Redis
	// (MEMORY USAGE), and that size per record.
	Records        int64   `json:"records"`
	HashBytes      int64   `json:"hash_bytes"`
	BytesPerRecord float64 `json:"bytes_per_record"`
	// Derived.
	CommandsPerSecond         float64 `json:"commands_per_second"`
	CallsPerProcessSecond     float64 `json:"script_calls_per_process_second"`
	CommandsPerFailingRequest float64 `json:"commands_per_failing_request"`
}

// commandStats reads Redis's INFO commandstats: all commands but INFO and
// CONFIG (the test's own), and the script calls.
func commandStats(t *testing.T, rdb *redis.Client) (commands, scripts int64) {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "cmdstat_"), ":calls=")
		if !ok || name == "info" || strings.HasPrefix(name, "config") {
			continue
		}
		n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		commands += n
		if name == "evalsha" || name == "eval" {
			scripts += n
		}
	}
	return commands, scripts
}

// runOutage measures an outage of d: procs processes send requests at rate
// each to a dependency that is down. Through Transports, each request is a
// real one to an httptest server; otherwise each is the budget calls a
// Transport makes for a request whose every attempt fails (Deposit(false),
// then a Withdraw per retry until refused or out of attempts).
func runOutage(t *testing.T, s *redisServer, procs int, rate float64, d time.Duration, viaTransport bool, timeout time.Duration) outageRun {
	t.Helper()
	admin := s.client()
	key := "load:" + strconv.FormatInt(time.Now().UnixNano(), 36)
	// The dependency is down: every attempt is answered 503, in memory, so
	// that thousands of requests a second cost the test little but the
	// budget's own work.
	down := roundTripperFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusServiceUnavailable, Body: http.NoBody, Request: r}, nil
	})
	var requests, retries atomic.Int64
	var wg sync.WaitGroup
	var clients []*redis.Client
	var budgets []*Budget
	var run []func()
	stop := make(chan struct{})
	for range procs {
		rdb := redis.NewClient(&redis.Options{Addr: s.addr(), ContextTimeoutEnabled: true})
		clients = append(clients, rdb)
		b, err := New(Options{Client: rdb, Key: key, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		budgets = append(budgets, b)
		send := func() {
			for range 2 { // MaxAttempts 3: up to two retries
				if _, ok := b.Withdraw(context.Background(), retryhttp.Transient); !ok {
					return
				}
				retries.Add(1)
			}
		}
		b.Deposit(false)
		if viaTransport {
			tr := &retryhttp.Transport{Base: down, Budget: b, Policy: retryhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
				OnAttempt: func(a retryhttp.Attempt) {
					if a.Decision == retryhttp.Retry {
						retries.Add(1)
					}
				}}
			send = func() {
				req, _ := http.NewRequest("GET", "http://dependency.test/", nil)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}
		}
		run = append(run, func() {
			tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					requests.Add(1)
					if !viaTransport {
						b.Deposit(false)
					}
					send()
				}
			}
		})
	}
	// The processes were running before the outage: connected, the script
	// loaded (a fleet's cold start is TestColdStartOneHopAway's).
	waitFor(t, "the processes' warm-up", func() bool {
		for _, b := range budgets {
			if b.out.Load() != 0 {
				return false
			}
		}
		return true
	})
	if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for _, f := range run {
		wg.Go(f)
	}
	start := time.Now()
	time.Sleep(d)
	close(stop)
	wg.Wait()
	secs := time.Since(start).Seconds()
	commands, scripts := commandStats(t, admin)
	var records int64
	for _, f := range admin.HKeys(context.Background(), key).Val() {
		if strings.HasPrefix(f, "p:") {
			records++
		}
	}
	hashBytes, _ := admin.MemoryUsage(context.Background(), key).Result()
	for _, c := range clients {
		c.Close()
	}
	r := outageRun{Processes: procs, Rate: rate, Transport: viaTransport, Seconds: secs, Requests: requests.Load(),
		Retries: retries.Load(), Commands: commands, ScriptCalls: scripts, Records: records, HashBytes: hashBytes,
		BytesPerRecord: float64(hashBytes) / float64(max(records, 1))}
	for _, b := range budgets {
		st := b.Stats()
		r.Failures += st.Failures
		r.FallbackPayments += st.FallbackPayments
	}
	r.CommandsPerSecond = float64(commands) / secs
	r.CallsPerProcessSecond = float64(scripts) / float64(procs) / secs
	r.CommandsPerFailingRequest = float64(commands) / float64(max(r.Requests, 1))
	return r
}

// 50 processes and thousands of failing requests through Transports: each
// process calls Redis about once a second, not once a retry decision, and
// the fleet makes one bucket's retries.
func TestOutageLoad(t *testing.T) {
	s := startRedis(t)
	// A Timeout of a second: under -race on a busy machine a process can
	// stall for longer than the default's 100ms, and a call that times out
	// falls back, which this test is not about (TestChaos is).
	r := runOutage(t, s, 50, 20, 3*time.Second, true, time.Second)
	t.Logf("%+v", r)
	drain := int64(DefaultCapacity / retryhttp.RetryCost)
	// A first call each, one recheck a Recheck (1 to 1.5 s) after it, and
	// the calls that took the bucket's tokens (a lease each).
	most := float64(r.Processes)*(1+r.Seconds/DefaultRecheck.Seconds()) + float64(DefaultCapacity/DefaultLease+1)
	if float64(r.ScriptCalls) > most {
		t.Errorf("got %d script calls from %d processes in %.1f s; want at most %.0f, about one a process a second",
			r.ScriptCalls, r.Processes, r.Seconds, most)
	}
	if r.Requests < 1000 { // 3,000 sent on time; a busy machine's ticks come late
		t.Errorf("got %d failing requests; want thousands", r.Requests)
	}
	// A process the machine stalls past the Timeout falls back to its own
	// bucket, as documented: those retries are the fallback's.
	if fleet := r.Retries - r.FallbackPayments; fleet < drain-5 || fleet > 2*drain {
		t.Errorf("got %d retries paid by the fleet's bucket (%d in all, %d by fallbacks); want about one bucket's %d, at most %d",
			fleet, r.Retries, r.FallbackPayments, drain, 2*drain)
	}
	if r.Records != int64(r.Processes) {
		t.Errorf("got %d process records in the bucket's hash; want %d, one a process", r.Records, r.Processes)
	}
}

// TestLoadModel measures the load model of docs/fleet.md (lab/fleet-load.sh): Redis
// commands during an outage at 10, 50 and 200 processes and two request
// rates, and this machine's Redis throughput for the budget's script.
func TestLoadModel(t *testing.T) {
	if *loadJSON == "" {
		t.Skip("a measurement for docs/fleet.md: run lab/fleet-load.sh")
	}
	s := startRedis(t)
	var runs []outageRun
	for _, procs := range []int{10, 50, 200} {
		for _, rate := range []float64{10, 100} {
			r := runOutage(t, s, procs, rate, 10*time.Second, false, 0)
			t.Logf("%+v", r)
			runs = append(runs, r)
		}
	}
	// The same, with real requests through Transports (the CI test's case,
	// longer).
	r := runOutage(t, s, 50, 40, 10*time.Second, true, 0)
	t.Logf("%+v", r)
	runs = append(runs, r)
	tp := scriptThroughput(t, s)
	out, _ := json.MarshalIndent(map[string]any{"outages": runs, "script_throughput": tp, "model": loadModel(runs, tp)}, "", "  ")
	if err := os.WriteFile(*loadJSON, append(out, '\n'), 0o644); err != nil {
		t.Fatal(err)
	}
}

// model is the load model of docs/fleet.md, from the measured runs:
// during an outage each process calls Redis at most about
// CallsPerProcessSecond times a second whatever its request rate, each call
// CommandsPerCall commands; one Redis runs ScriptCallsPerSecond calls (the
// slower of the script's two paths, measured with its client on the same
// machine), so it serves Processes processes in an outage.
type model struct {
	CallsPerProcessSecond float64 `json:"calls_per_process_second"` // the most over the runs
	CommandsPerCall       float64 `json:"commands_per_call"`        // the most over the runs
	ScriptCallsPerSecond  float64 `json:"script_calls_per_second"`  // the least of the two paths
	ServerUsecPerCall     float64 `json:"server_usec_per_call"`     // the most of the two paths
	Processes             float64 `json:"processes_one_redis_serves"`
	ProcessesByServerTime float64 `json:"processes_by_redis_time_alone"`
	At10000               float64 `json:"calls_per_second_at_10000_processes"`
	// Shards (Options.Shards, on as many Redis Cluster nodes) for 10,000
	// processes at ScriptCallsPerSecond a node.
	ShardsFor10000 float64 `json:"shards_for_10000_processes"`
	// Before: one call per retry decision, at least one per failing
	// request: 10,000 processes at 100 failing requests a second each.
	Before10000x100 float64 `json:"calls_per_second_before_at_10000_processes_100_per_second"`
}

func loadModel(runs []outageRun, tp []throughput) model {
	var m model
	for _, r := range runs {
		m.CallsPerProcessSecond = max(m.CallsPerProcessSecond, r.CallsPerProcessSecond)
		m.CommandsPerCall = max(m.CommandsPerCall, float64(r.Commands)/float64(r.ScriptCalls))
	}
	for i, x := range tp {
		if i == 0 || x.CallsPerSec < m.ScriptCallsPerSecond {
			m.ScriptCallsPerSecond = x.CallsPerSec
		}
		m.ServerUsecPerCall = max(m.ServerUsecPerCall, x.ServerUsecPer)
	}
	m.Processes = m.ScriptCallsPerSecond / m.CallsPerProcessSecond
	m.ProcessesByServerTime = 1e6 / m.ServerUsecPerCall / m.CallsPerProcessSecond
	m.At10000 = 10000 * m.CallsPerProcessSecond
	m.ShardsFor10000 = math.Ceil(m.At10000 / m.ScriptCallsPerSecond)
	m.Before10000x100 = 10000 * 100
	return m
}

// throughput is what 50 connections, each a process of its own (its own
// record, its sequence number rising), measured for the budget's script on
// one bucket, no pipelining, and Redis's own time per call.
type throughput struct {
	Case          string    `json:"case"`
	Command       string    `json:"command"`
	Runs          []float64 `json:"runs_calls_per_second"`
	CallsPerSec   float64   `json:"calls_per_second"` // the median run's
	ServerUsecPer float64   `json:"server_usec_per_call"`
}

func scriptThroughput(t *testing.T, s *redisServer) []throughput {
	ctx := context.Background()
	rdb := s.client()
	if err := takeScript.Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	const conns, each = 50, 2 * time.Second
	var out []throughput
	for _, c := range []struct {
		name     string
		capacity int64 // the bucket's: 500 drained, or one never drained
	}{
		{"bucket empty: a refusal", DefaultCapacity},
		{"a lease granted", 1 << 50},
	} {
		key := "bench:" + strconv.FormatInt(c.capacity, 10)
		// Three runs, the median kept: this machine is shared, and a run
		// whose client or server was starved is slower.
		var rpss, usecs []float64
		for run := range 3 {
			rdb.Del(ctx, key)
			if c.capacity == DefaultCapacity {
				rdb.HSet(ctx, key, "tokens", 0)
			}
			rdb.ConfigResetStat(ctx)
			var calls atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for p := range conns {
				wg.Go(func() {
					id := strconv.Itoa(run*conns + p)
					pc := redis.NewClient(&redis.Options{Addr: s.addr(), PoolSize: 1})
					defer pc.Close()
					var granted int64
					for seq := int64(1); time.Since(start) < each; seq++ {
						r, err := takeScript.Run(ctx, pc, []string{key}, id, seq, retryhttp.RetryCost, DefaultLease, c.capacity, 3600000,
							granted, 0, granted, 0, 0, 0, min(seq-1, 1)).Int64Slice()
						if err != nil {
							t.Error(err)
							return
						}
						granted = r[0] // spent at once
						calls.Add(1)
					}
				})
			}
			wg.Wait()
			rps := float64(calls.Load()) / time.Since(start).Seconds()
			info := rdb.Info(ctx, "commandstats").Val()
			var usec float64
			if i := strings.Index(info, "cmdstat_evalsha:"); i >= 0 {
				line := info[i:]
				line = line[:strings.IndexByte(line, '\n')]
				if j := strings.Index(line, "usec_per_call="); j >= 0 {
					v := line[j+len("usec_per_call="):]
					usec, _ = strconv.ParseFloat(v[:strings.IndexByte(v, ',')], 64)
				}
			}
			rpss, usecs = append(rpss, rps), append(usecs, usec)
		}
		slices.Sort(rpss)
		slices.Sort(usecs)
		out = append(out, throughput{Case: c.name, Command: fmt.Sprintf("%d go-redis connections, each a process, EVALSHA for %v", conns, each),
			Runs: rpss, CallsPerSec: rpss[1], ServerUsecPer: usecs[1]})
		t.Logf("%s: %.0f calls/s (runs %v), %.2f µs a call in Redis", c.name, rpss[1], rpss, usecs[1])
	}
	return out
}

// After an outage, successes refill the fleet's bucket and retries are
// allowed again within about a second (a Recheck): every process sends its
// deposits at most once a Recheck, and learns the bucket's level from the
// answer.
func TestRetriesBackAfterRecovery(t *testing.T) {
	s := startRedis(t)
	var down atomic.Bool
	var n atomic.Int64
	down.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Down; then one request in ten fails.
		if down.Load() || n.Add(1)%10 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	var recovered, firstRetry atomic.Int64 // ns since start
	start := time.Now()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 10 {
		rdb := s.client()
		b := newBudget(t, rdb, "fleet", func(o *Options) { o.Timeout = DefaultTimeout })
		tr := &retryhttp.Transport{Budget: b, Policy: retryhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			OnAttempt: func(a retryhttp.Attempt) {
				if r := recovered.Load(); a.Decision == retryhttp.Retry && r > 0 {
					firstRetry.CompareAndSwap(0, int64(time.Since(start)))
				}
			}}
		defer tr.CloseIdleConnections()
		wg.Go(func() {
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
					req, _ := http.NewRequest("GET", srv.URL, nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						resp.Body.Close()
					}
				}
			}
		})
	}
	time.Sleep(2 * time.Second) // the bucket drains; every process sees it empty
	late := startLateness()
	recovered.Store(int64(time.Since(start)))
	down.Store(false)
	waitFor(t, "a retry after the recovery", func() bool { return firstRetry.Load() != 0 })
	close(stop)
	wg.Wait()
	worst := late.Stop()
	after := time.Duration(firstRetry.Load() - recovered.Load())
	t.Logf("first retry %v after the dependency recovered (the machine late by up to %v)", after, worst)
	// A Recheck drawn up to 1.5 times, the requests' 20 ms ticks, and
	// however late the machine ran the processes' goroutines.
	if after > DefaultRecheck*3/2+200*time.Millisecond+4*worst {
		t.Errorf("the first retry came %v after the recovery; want within about a Recheck (%v, drawn up to 1.5 times)", after, DefaultRecheck)
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
