// Command herd shows what retries do to a dependency that comes back from an
// outage, with retryhttp's own code.
//
//	go run ./examples/herd                     # 1,000 real clients over loopback (the demo)
//	go run ./examples/herd -json               # the same, as JSON (lab/runs/herd-real.json)
//	go run ./examples/herd -model -seeds 200   # the discrete-event model, many seeds
//	go run ./examples/herd -model -json        # the same, as JSON (lab/runs/herd-model.json)
//	go run ./examples/herd -budget             # when the retry budget starts to drain
//	go run ./examples/herd -budget -json       # the same, as JSON (lab/runs/budget.json)
//	go run ./examples/herd -layers             # retries multiplying through layers
//	go run ./examples/herd -layers -json       # the same, as JSON (lab/runs/herd-layers.json)
//
// The sentences the demo prints are derived from its own figures.
//
// The herd: 1,000 clients fail at t = 0; the server is down for 10 s, then
// serves 100 requests per second and rejects the rest; every client retries
// with base 1 s and cap 30 s. See docs/herd.md.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/herdproof/retryhttp/internal/herd"
)

func main() {
	model := flag.Bool("model", false, "run the discrete-event model instead of real clients")
	seeds := flag.Int("seeds", 20, "with -model: seeds per schedule")
	asJSON := flag.Bool("json", false, "print one JSON object instead of tables")
	budget := flag.Bool("budget", false, "measure the retry budget around its break-even point")
	requests := flag.Int("requests", 0, "with -budget: requests per point (default 100,000); with -layers: requests per flaky chain (default 1,000)")
	layers := flag.Bool("layers", false, "measure retries through 1 to 4 layers of services")
	scale := flag.Float64("scale", 0.15, "real clients: wall-clock seconds per model second")
	flag.Parse()

	switch {
	case *model:
		runModel(*seeds, *asJSON)
	case *budget:
		runBudget(orDefault(*requests, 100_000), *asJSON)
	case *layers:
		runLayers(orDefault(*requests, 1000), *asJSON)
	default:
		runReal(time.Duration(*scale*float64(time.Second)), *asJSON)
	}
}

func orDefault(n, def int) int {
	if n <= 0 {
		return def
	}
	return n
}

func runModel(seeds int, asJSON bool) {
	sum := herd.Standard.Summary(seeds)
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"schedules": sum}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	fmt.Printf("The herd model, %d seeds per schedule (median [p5, p95]; ideal: everyone back at %v s)\n\n",
		seeds, herd.Standard.Ideal().Seconds())
	fmt.Printf("%-13s %22s %22s %22s %26s\n", "schedule", "retries", "rejected after 10s", "peak per second", "last client back (s)")
	for _, s := range sum {
		fmt.Printf("%-13s %22s %22s %22s %26s\n", s.Name, stat(s.Retries, "%.0f"), stat(s.Rejected, "%.0f"), stat(s.Peak, "%.0f"), stat(s.LastSeconds, "%.1f"))
	}
}

func stat(s herd.Stats, f string) string {
	return fmt.Sprintf(f+" ["+f+", "+f+"]", s.Median, s.P5, s.P95)
}

func printJSON(v any) {
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
