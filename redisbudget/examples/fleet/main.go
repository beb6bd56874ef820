// Command fleet shows a retry budget shared by a fleet through Redis. It
// starts a redis-server of its own on loopback (or uses REDIS_URL), a server
// that is down for an outage and then recovers, and N clients, each with its
// own Transport and its own Redis connection, sending requests at a steady
// rate. It runs the same traffic twice: once with a private 500-token budget
// per client, once with one budget shared through Redis.
//
//	cd redisbudget && go run ./examples/fleet                            # a table
//	cd redisbudget && go run ./examples/fleet -json                      # one JSON object
//	cd redisbudget && go run ./examples/fleet -out ../lab/runs/fleet.json    # the table, and the JSON saved
//
// The fleet's budgets use redisbudget's default Options. See docs/fleet.md.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/redisbudget"
	"github.com/redis/go-redis/v9"
)

// config is one run's traffic.
type config struct {
	Clients int
	Rate    float64       // requests a second, per client
	Warm    time.Duration // healthy, before the outage
	Outage  time.Duration // the server answers 503
	Recover time.Duration // healthy again
}

// stats is what one run measured.
type stats struct {
	Retries            int64   `json:"retries"`
	Requests           int64   `json:"requests"`
	AttemptsPerRequest float64 `json:"attempts_per_request"`
	// The shared budget's: retries beyond one bucket's drain, fallbacks
	// (reported by OnFallback), retries the fallbacks paid, calls to Redis
	// and retries refused without one (redisbudget.Stats).
	Overshoot        *int64 `json:"overshoot,omitempty"`
	Fallbacks        *int64 `json:"fallbacks,omitempty"`
	FallbackPayments *int64 `json:"fallback_payments,omitempty"`
	RedisCalls       *int64 `json:"redis_calls,omitempty"`
	LocalRefusals    *int64 `json:"local_refusals,omitempty"`
}

// report is the run's JSON: the command that made it, its traffic, and
// what it measured.
type report struct {
	Command       string  `json:"command"`
	Redis         string  `json:"redis"`
	Clients       int     `json:"clients"`
	Rate          float64 `json:"rate_per_client"`
	WarmSeconds   float64 `json:"warm_seconds"`
	OutageSeconds float64 `json:"outage_seconds"`
	RecoverSecs   float64 `json:"recover_seconds"`
	Drain         int64   `json:"drain"` // one bucket's retries: capacity / retry cost
	Private       stats   `json:"private"`
	Fleet         stats   `json:"fleet"`
}

func main() {
	asJSON := flag.Bool("json", false, "print one JSON object")
	out := flag.String("out", "", "also write the JSON object to this file")
	cfg := config{}
	flag.IntVar(&cfg.Clients, "clients", 20, "clients, each with its own Transport and Redis connection")
	flag.Float64Var(&cfg.Rate, "rate", 20, "requests a second, per client")
	flag.DurationVar(&cfg.Warm, "warm", 2*time.Second, "healthy time before the outage")
	flag.DurationVar(&cfg.Outage, "outage", 10*time.Second, "the outage")
	flag.DurationVar(&cfg.Recover, "recover", 3*time.Second, "healthy time after the outage")
	flag.Parse()
	// go-redis logs every failed dial; with Redis unreachable that is a
	// line per retry, and the budget reports its fallbacks itself.
	redis.SetLogger(quiet{})

	addr, stop, err := redisAddr()
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	if !*asJSON {
		fmt.Printf("%d clients at %.0f requests/s each; healthy %v, down %v, healthy %v. Redis at %s.\n",
			cfg.Clients, cfg.Rate, cfg.Warm, cfg.Outage, cfg.Recover, addr)
	}
	private := run(cfg, func(int) retryhttp.Budget { return retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens) })
	fleet := runFleet(cfg, addr, "retryhttp:fleet-example:"+strconv.FormatInt(time.Now().UnixNano(), 36))
	rep := report{Command: command(), Redis: "a redis-server of its own, on loopback", Clients: cfg.Clients, Rate: cfg.Rate,
		WarmSeconds: cfg.Warm.Seconds(), OutageSeconds: cfg.Outage.Seconds(), RecoverSecs: cfg.Recover.Seconds(),
		Drain: retryhttp.DefaultBudgetTokens / retryhttp.RetryCost, Private: private, Fleet: fleet}
	if u := os.Getenv("REDIS_URL"); u != "" {
		rep.Redis = u
	}
	js, _ := json.MarshalIndent(rep, "", "  ")
	js = append(js, '\n')
	if *out != "" {
		if err := os.WriteFile(*out, js, 0o644); err != nil {
			log.Fatal(err)
		}
	}
	if *asJSON {
		os.Stdout.Write(js)
		return
	}
	fmt.Printf("\n%-34s %10s %10s %22s\n", "budget", "requests", "retries", "attempts per request")
	fmt.Printf("%-34s %10d %10d %22.3f\n", fmt.Sprintf("private, %d tokens per client", retryhttp.DefaultBudgetTokens),
		private.Requests, private.Retries, private.AttemptsPerRequest)
	fmt.Printf("%-34s %10d %10d %22.3f\n", fmt.Sprintf("one %d-token bucket, in Redis", retryhttp.DefaultBudgetTokens),
		fleet.Requests, fleet.Retries, fleet.AttemptsPerRequest)
	fmt.Printf("\nOne bucket's drain is %d retries (%d/%d). Overshoot of the shared bucket: %d retries; fallbacks: %d, "+
		"paying for %d retries; calls to Redis: %d; retries refused without a call: %d.\n",
		rep.Drain, retryhttp.DefaultBudgetTokens, retryhttp.RetryCost, *fleet.Overshoot, *fleet.Fallbacks,
		*fleet.FallbackPayments, *fleet.RedisCalls, *fleet.LocalRefusals)
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// command is the command line that made this run, as a user would type it
// in redisbudget/.
func command() string {
	c := "go run ./examples/fleet"
	if u := os.Getenv("REDIS_URL"); u != "" {
		c = "REDIS_URL=" + u + " " + c
	}
	for _, a := range os.Args[1:] {
		c += " " + a
	}
	return c
}

// runFleet runs cfg with one budget shared through Redis under key, each
// client with its own connection.
func runFleet(cfg config, addr, key string) stats {
	var fallbacks atomic.Int64
	var clients []*redis.Client
	var budgets []*redisbudget.Budget
	defer func() {
		for _, c := range clients {
			c.Close()
		}
	}()
	st := run(cfg, func(int) retryhttp.Budget {
		rdb := redis.NewClient(&redis.Options{Addr: addr}) // go-redis's defaults
		clients = append(clients, rdb)
		b, err := redisbudget.New(redisbudget.Options{Client: rdb, Key: key,
			OnFallback: func(err error) {
				if err != nil {
					fallbacks.Add(1)
				}
			}})
		if err != nil {
			log.Fatal(err)
		}
		budgets = append(budgets, b)
		return b
	})
	over := st.Retries - retryhttp.DefaultBudgetTokens/retryhttp.RetryCost
	f := fallbacks.Load()
	var paid, calls, refused int64
	for _, b := range budgets {
		s := b.Stats()
		paid += s.FallbackPayments
		calls += s.Calls
		refused += s.LocalRefusals
	}
	st.Overshoot, st.Fallbacks, st.FallbackPayments, st.RedisCalls, st.LocalRefusals = &over, &f, &paid, &calls, &refused
	return st
}

// run sends cfg's traffic from cfg.Clients clients, client i paying for its
// retries from budget(i), against a server that is down during the outage.
func run(cfg config, budget func(i int) retryhttp.Budget) stats {
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()

	var requests, retries, attempts atomic.Int64
	start := time.Now()
	end := start.Add(cfg.Warm + cfg.Outage + cfg.Recover)
	go func() {
		time.Sleep(cfg.Warm)
		down.Store(true)
		time.Sleep(cfg.Outage)
		down.Store(false)
	}()
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		tr := &retryhttp.Transport{Budget: budget(i),
			Policy: retryhttp.Policy{BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond},
			OnAttempt: func(a retryhttp.Attempt) {
				attempts.Add(1)
				if a.Decision == retryhttp.Retry {
					retries.Add(1)
				}
			}}
		wg.Go(func() {
			defer tr.CloseIdleConnections()
			tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.Rate))
			defer tick.Stop()
			for now := range tick.C {
				if now.After(end) {
					return
				}
				req, _ := http.NewRequest("GET", srv.URL, nil)
				requests.Add(1)
				if resp, err := tr.RoundTrip(req); err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	wg.Wait()
	return stats{Retries: retries.Load(), Requests: requests.Load(),
		AttemptsPerRequest: float64(attempts.Load()) / float64(max(requests.Load(), 1))}
}

// redisAddr returns the address of REDIS_URL's server, or starts a
// redis-server of its own on a free loopback port in a temp dir.
func redisAddr() (addr string, stop func(), err error) {
	if u := os.Getenv("REDIS_URL"); u != "" {
		opt, err := redis.ParseURL(u)
		if err != nil {
			return "", nil, err
		}
		return opt.Addr, func() {}, nil
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir, err := os.MkdirTemp("", "fleet-redis-")
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("starting redis-server (apt-get install -y redis-server, or set REDIS_URL): %w", err)
	}
	stop = func() {
		cmd.Process.Kill()
		cmd.Wait()
		os.RemoveAll(dir)
	}
	addr = "127.0.0.1:" + strconv.Itoa(port)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			stop()
			return "", nil, fmt.Errorf("redis-server did not answer on %s", addr)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return addr, stop, nil
}
