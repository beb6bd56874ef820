// Command hedge compares hedging implementations on a loopback server whose
// latency has a heavy tail, and on one that is slow for everyone:
//
//	cd lab/bench && go run ./cmd/hedge          # a table
//	cd lab/bench && go run ./cmd/hedge -json    # one JSON object
//
// See docs/guide-hedging.md and docs/benchmarks.md.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/herdproof/retryhttp/lab/bench"
)

func main() {
	asJSON := flag.Bool("json", false, "print one JSON object")
	cfg := bench.DefaultHedgeConfig
	flag.IntVar(&cfg.TailRequests, "tail-requests", cfg.TailRequests, "requests of the tail workload")
	flag.IntVar(&cfg.SlowRequests, "slow-requests", cfg.SlowRequests, "requests of the slow-all workload")
	flag.IntVar(&cfg.Workers, "workers", cfg.Workers, "concurrent clients")
	flag.DurationVar(&cfg.Delay, "delay", cfg.Delay, "hedge delay")
	flag.Parse()

	runs := bench.HedgeComparison(cfg)
	if *asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(map[string]any{"runs": runs})
		return
	}
	fmt.Printf("%d workers; tail: %.0f%% of answers in %v, the rest in %v (%d requests); slow-all: every answer in %v (%d requests); hedge delay %v\n\n",
		cfg.Workers, 100*cfg.SlowShare, cfg.Slow, cfg.Fast, cfg.TailRequests, cfg.Slow, cfg.SlowRequests, cfg.Delay)
	fmt.Printf("| implementation | workload | p50 (ms) | p99 (ms) | p99.9 (ms) | requests per request | second half |\n|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		fmt.Printf("| %s | %s | %.1f | %.1f | %.1f | %.3f | %.3f |\n", r.Name, r.Workload, r.P50, r.P99, r.P999, r.RequestsPerRequest, r.SteadyRequestsPerRequest)
	}
}
