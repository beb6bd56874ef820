// Command herd shows what retries do to a dependency that comes back from an
// outage, with retryhttp's own code.
//
//	go run ./examples/herd                     # 1,000 real clients over loopback (the demo)
//	go run ./examples/herd -model -seeds 200   # the discrete-event model, many seeds
//	go run ./examples/herd -model -json        # the same, as JSON
//	go run ./examples/herd -budget             # when the retry budget starts to drain
//	go run ./examples/herd -layers             # retries multiplying through layers
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

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/herd"
)

func main() {
	model := flag.Bool("model", false, "run the discrete-event model instead of real clients")
	seeds := flag.Int("seeds", 20, "with -model: seeds per schedule")
	asJSON := flag.Bool("json", false, "with -model: print JSON")
	budget := flag.Bool("budget", false, "measure the retry budget around its break-even point")
	requests := flag.Int("requests", 100_000, "with -budget: requests per point")
	layers := flag.Bool("layers", false, "measure retries through 1 to 4 layers of services")
	scale := flag.Float64("scale", 0.15, "real clients: wall-clock seconds per model second")
	flag.Parse()

	switch {
	case *model:
		runModel(*seeds, *asJSON)
	case *budget:
		runBudget(*requests)
	case *layers:
		runLayers()
	default:
		runReal(time.Duration(*scale * float64(time.Second)))
	}
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
	fmt.Printf("The herd model, %d seeds per schedule (median [p5, p95]; ideal: everyone back at %v)\n\n",
		seeds, herd.Standard.Ideal().Seconds())
	fmt.Printf("%-13s %22s %22s %22s %26s\n", "schedule", "retries", "rejected after 10s", "peak per second", "last client back (s)")
	for _, s := range sum {
		fmt.Printf("%-13s %22s %22s %22s %26s\n", s.Name, stat(s.Retries, "%.0f"), stat(s.Rejected, "%.0f"), stat(s.Peak, "%.0f"), stat(s.LastSeconds, "%.1f"))
	}
}

func stat(s herd.Stats, f string) string {
	return fmt.Sprintf(f+" ["+f+", "+f+"]", s.Median, s.P5, s.P95)
}

func runBudget(requests int) {
	noWait := retryhttp.Policy{Rand: func(int64) int64 { return 0 }}
	for _, kind := range []struct {
		name   string
		status int
		cost   int
	}{{"transient (503), 14 tokens a retry", 503, retryhttp.RetryCost}, {"throttling (429), 5 tokens a retry", 429, retryhttp.ThrottleRetryCost}} {
		p := herd.BreakEven(kind.cost)
		fmt.Printf("%s: p* = %.4f\n", kind.name, p)
		fmt.Printf("  %-10s %-8s %10s %10s %10s %12s\n", "p", "", "retries", "refused", "refused %", "fewest left")
		for i, off := range []float64{-0.10, -0.05, -0.02, -0.01, 0, 0.01, 0.02, 0.05, 0.10, 0.20} {
			q := herd.DriveQuota(noWait, p+off, kind.status, requests, uint64(i+1))
			fmt.Printf("  %-10.4f p*%+-6.2f %10d %10d %9.2f%% %12d\n", q.P, off, q.Retries, q.Refused, 100*q.RefusedShare(), q.MinLeft)
		}
		fmt.Println()
	}
}

func runLayers() {
	quick := retryhttp.Policy{BaseDelay: time.Microsecond, MaxDelay: time.Millisecond}
	fmt.Println("Attempts reaching a bottom service that always answers 503, through k layers of 3 attempts")
	fmt.Printf("%-3s %22s %30s %30s\n", "k", "1 request, no budgets", "1,000 requests, default budgets", "1,000 requests, one retrying layer")
	for k := 1; k <= 4; k++ {
		unbounded := herd.NewChain(k, func(int) *retryhttp.Transport {
			return &retryhttp.Transport{Policy: quick, Budget: retryhttp.UnlimitedBudget()}
		})
		one := unbounded.Call(1)
		unbounded.Close()

		budgeted := herd.NewChain(k, func(int) *retryhttp.Transport { return &retryhttp.Transport{Policy: quick} })
		withBudgets := budgeted.Call(1000)
		budgeted.Close()

		layered := herd.NewChain(k, func(i int) *retryhttp.Transport {
			p := quick
			if i < k {
				p.MaxAttempts = 1 // propagate; only the layer next to the dependency retries
			}
			return &retryhttp.Transport{Policy: p}
		})
		oneLayer := layered.Call(1000)
		layered.Close()
		fmt.Printf("%-3d %22d %22d (%.2f each) %22d (%.2f each)\n", k, one, withBudgets, float64(withBudgets)/1000, oneLayer, float64(oneLayer)/1000)
	}
}
