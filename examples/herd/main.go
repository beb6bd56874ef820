// Command herd shows what retries do to a dependency that comes back from an
// outage, with retryhttp's own code.
//
//	go run ./examples/herd                     # 1,000 real clients over loopback (the demo)
//	go run ./examples/herd -model -seeds 200   # the discrete-event model, many seeds
//	go run ./examples/herd -model -json        # the same, as JSON
//	go run ./examples/herd -budget             # when the retry budget starts to drain
//	go run ./examples/herd -layers             # retries multiplying through layers
//	go run ./examples/herd -layers -json       # with and without retryhttp.Handler, as JSON
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
	asJSON := flag.Bool("json", false, "with -model or -layers: print JSON")
	budget := flag.Bool("budget", false, "measure the retry budget around its break-even point")
	requests := flag.Int("requests", 0, "with -budget: requests per point (default 100,000); with -layers: requests per flaky chain (default 1,000)")
	layers := flag.Bool("layers", false, "measure retries through 1 to 4 layers of services")
	scale := flag.Float64("scale", 0.15, "real clients: wall-clock seconds per model second")
	flag.Parse()

	switch {
	case *model:
		runModel(*seeds, *asJSON)
	case *budget:
		runBudget(orDefault(*requests, 100_000))
	case *layers:
		runLayers(orDefault(*requests, 1000), *asJSON)
	default:
		runReal(time.Duration(*scale * float64(time.Second)))
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
	compareBudgets()
}

// compareBudgets prints docs/budget.md's comparison of the token bucket and
// the ratio budget on the same workloads, 100 requests a second, 3 attempts.
func compareBudgets() {
	const rate = 100
	fmt.Println("The token bucket beside the ratio budget, 100 requests a second, 3 attempts, transient failures")
	fmt.Println()
	fmt.Println("Steady failure rate p for 60 s: share of wanted retries refused, attempts per request")
	fmt.Printf("  %-30s", "budget")
	ps := []float64{0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.50}
	for _, p := range ps {
		fmt.Printf("   p=%.2f      ", p)
	}
	fmt.Println()
	for _, kind := range herd.Budgets {
		fmt.Printf("  %-30s", kind.Name)
		for i, p := range ps {
			s := herd.BudgetRun(kind, []herd.Phase{{Seconds: 60, P: p}}, rate, uint64(i+1))
			tot := herd.Totals(s, 0, len(s))
			fmt.Printf(" %5.1f%% %5.3fx ", 100*float64(tot.Refused)/float64(max(tot.Retries+tot.Refused, 1)), float64(tot.Attempts)/float64(tot.Requests))
		}
		fmt.Println()
	}
	fmt.Println()
	fmt.Println("30 s healthy (p=0.01), a 60 s outage (p=1), 60 s recovered (p=0.05)")
	fmt.Printf("  %-30s %18s %18s %22s %22s\n", "budget", "outage retries", "outage att./req", "refused after it", "refusing until (s)")
	for _, kind := range herd.Budgets {
		s := herd.BudgetRun(kind, herd.OutageTimeline, rate, 1)
		out := herd.Totals(s, 30, 90)
		after := herd.Totals(s, 90, 150)
		until := 0 // the last second after the outage with a refusal
		for _, x := range s[90:] {
			if x.Refused > 0 {
				until = x.T - 90 + 1
			}
		}
		fmt.Printf("  %-30s %18d %17.3fx %22d %22d\n", kind.Name, out.Retries, float64(out.Attempts)/float64(out.Requests), after.Refused, until)
	}
}

func runLayers(requests int, asJSON bool) {
	if asJSON {
		chains, mixed := herd.SignalChains(requests)
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(map[string]any{"chains": chains, "mixed": mixed}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	quick := retryhttp.Policy{BaseDelay: time.Microsecond, MaxDelay: time.Millisecond}
	// every makes each layer's Transport: 3 attempts, or 1 above the
	// layer next to the dependency; a budget of its own, or none.
	every := func(k int, oneLayer, budgets bool) func(int) *retryhttp.Transport {
		return func(i int) *retryhttp.Transport {
			p := quick
			if oneLayer && i < k {
				p.MaxAttempts = 1 // propagate: only the layer next to the dependency retries
			}
			tr := &retryhttp.Transport{Policy: p}
			if !budgets {
				tr.Budget = retryhttp.UnlimitedBudget()
			}
			return tr
		}
	}
	measure := func(k, requests int, oneLayer, budgets bool) float64 {
		c := herd.NewChain(k, every(k, oneLayer, budgets))
		defer c.Close()
		return float64(c.Call(requests)) / float64(requests)
	}
	fmt.Println("Attempts reaching a bottom service that always answers 503, per top-level request,")
	fmt.Println("through k services that each retry with 3 attempts")
	fmt.Printf("%-3s %16s %18s %20s %22s\n", "k", "every layer", "every layer,", "one retrying layer", "one retrying layer,")
	fmt.Printf("%-3s %16s %18s %20s %22s\n", "", "(1 request)", "default budgets", "(100 requests)", "default budgets")
	for k := 1; k <= 4; k++ {
		fmt.Printf("%-3d %16.0f %18.2f %20.2f %22.2f\n", k,
			measure(k, 1, false, false), measure(k, 1000, false, true),
			measure(k, 100, true, false), measure(k, 1000, true, true))
	}
	fmt.Println("(the budgeted columns: 1,000 requests each, in one sustained outage)")

	chains, mixed := herd.SignalChains(requests)
	fmt.Println()
	fmt.Println("Every layer retrying (3 attempts, no budget), with and without retryhttp.Handler,")
	fmt.Printf("in front of a bottom that is down or fails 30%% of attempts at random (%d requests a flaky chain)\n", requests)
	fmt.Printf("%-3s %-7s %36s   %36s\n", "", "", "without the signal", "with retryhttp.Handler")
	fmt.Printf("%-3s %-7s %12s %12s %10s   %12s %12s %10s\n", "k", "bottom", "attempts/req", "most/req", "success", "attempts/req", "most/req", "success")
	for i := 0; i+1 < len(chains); i += 2 {
		off, on := chains[i], chains[i+1]
		fmt.Printf("%-3d %-7s %12.2f %12d %9.1f%%   %12.2f %12d %9.1f%%\n", off.Layers, off.Bottom,
			off.AttemptsPerRequest, off.MostAttempts, 100*off.SuccessRate,
			on.AttemptsPerRequest, on.MostAttempts, 100*on.SuccessRate)
	}
	fmt.Println()
	fmt.Println("Four layers under the signal but one, bottom down: attempts at the bottom per request")
	for _, m := range mixed {
		fmt.Printf("  layer %d without the middleware: %.0f\n", m.Without, m.AttemptsPerRequest)
	}
}
