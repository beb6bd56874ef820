// Command throttle compares client-side throttling on one workload: a
// server with a fixed capacity that answers 429 above it (halving half-way
// through), and clients that want five times that capacity. It runs no
// limiter, the AWS SDK for Go v2's adaptive retry mode (a real STS client),
// failsafe-go's adaptive throttler and this library's RateLimiter one after
// the other, each against a loopback server of its own, in real time, or
// with -fake in fake time (testing/synctest), called in memory:
//
//	cd lab/bench && go run ./cmd/throttle          # a table
//	cd lab/bench && go run ./cmd/throttle -json    # one JSON object
//	cd lab/bench && go run ./cmd/throttle -fake -json > ../runs/throttling-fake.json
//	cd lab/bench && go run ./cmd/throttle -in ../runs/throttling.json  # its table
//
// bench's TestThrottlingGoals runs this library's limiter in fake time
// against the other implementations' runs saved with -fake. See
// docs/throttling.md.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/herdproof/retryhttp/lab/bench"
)

func main() {
	asJSON := flag.Bool("json", false, "print one JSON object")
	fake := flag.Bool("fake", false, "run in fake time, in memory, instead of over loopback")
	cfg := bench.DefaultThrottleConfig
	flag.Float64Var(&cfg.Capacity, "capacity", cfg.Capacity, "the server's requests per second (halved half-way)")
	flag.IntVar(&cfg.Clients, "clients", cfg.Clients, "clients")
	flag.Float64Var(&cfg.PerClient, "per-client", cfg.PerClient, "requests per second each client wants")
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the run")
	flag.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the clients' request times")
	in := flag.String("in", "", "print the table of a JSON result saved earlier instead of running")
	testing.Init()
	flag.Parse()

	if *in != "" {
		var saved struct{ Runs []bench.ThrottleRun }
		b, err := os.ReadFile(*in)
		if err == nil {
			err = json.Unmarshal(b, &saved)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Print(bench.ThrottleTable(saved.Runs))
		return
	}
	print := func(runs []bench.ThrottleRun, clock string) {
		if *asJSON {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			enc.Encode(map[string]any{"capacity": cfg.Capacity, "clock": clock, "runs": runs})
			return
		}
		fmt.Printf("%d clients x %g requests/s against a capacity of %g/s (%g/s after %v), %v, %s\n\n",
			cfg.Clients, cfg.PerClient, cfg.Capacity, cfg.Capacity/2, cfg.Duration/2, cfg.Duration, clock)
		fmt.Print(bench.ThrottleTable(runs))
	}
	if *fake {
		// A bubble needs a *testing.T: the run is the one test of a
		// testing.Main, whose own verdict goes to stderr.
		out := os.Stdout
		os.Stdout = os.Stderr
		testing.Main(func(string, string) (bool, error) { return true, nil },
			[]testing.InternalTest{{Name: "Throttle", F: func(t *testing.T) {
				os.Stdout = out
				print(bench.ThrottleInMemory(t, cfg), "fake")
				os.Stdout = os.Stderr
			}}}, nil, nil)
		return
	}
	print(bench.ThrottleLoopback(cfg), "loopback")
}
