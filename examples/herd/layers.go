package main

import (
	"fmt"
	"time"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/herd"
)

// multiplyRow is one row of docs/herd.md's §4 table: attempts reaching a
// bottom service that always answers 503, per top-level request, through
// k services that each retry with 3 attempts.
type multiplyRow struct {
	Layers int `json:"layers"`
	// EveryLayer: every layer retries, no budgets (1 request).
	EveryLayer float64 `json:"every_layer"`
	// EveryLayerBudgets: every layer retries, default budgets (1,000
	// requests in one sustained outage).
	EveryLayerBudgets float64 `json:"every_layer_budgets"`
	// OneLayer: only the layer next to the bottom retries (100 requests).
	OneLayer float64 `json:"one_layer"`
	// OneLayerBudgets: the same with default budgets (1,000 requests).
	OneLayerBudgets float64 `json:"one_layer_budgets"`
}

// signalRow is one row of docs/herd.md's §5 table: a chain without and
// with retryhttp.Handler.
type signalRow struct {
	Layers  int              `json:"layers"`
	Bottom  string           `json:"bottom"`
	Without herd.ChainResult `json:"without"`
	With    herd.ChainResult `json:"with"`
}

func multiply() []multiplyRow {
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
				tr.Budget = herd.Unlimited()
			}
			return tr
		}
	}
	measure := func(k, requests int, oneLayer, budgets bool) float64 {
		c := herd.NewChain(k, every(k, oneLayer, budgets))
		defer c.Close()
		return float64(c.Call(requests)) / float64(requests)
	}
	var rows []multiplyRow
	for k := 1; k <= 4; k++ {
		rows = append(rows, multiplyRow{Layers: k,
			EveryLayer: measure(k, 1, false, false), EveryLayerBudgets: measure(k, 1000, false, true),
			OneLayer: measure(k, 100, true, false), OneLayerBudgets: measure(k, 1000, true, true)})
	}
	return rows
}

func runLayers(requests int, asJSON bool) {
	rows := multiply()
	chains, mixed := herd.SignalChains(requests)
	var signal []signalRow
	for i := 0; i+1 < len(chains); i += 2 {
		off, on := chains[i], chains[i+1]
		signal = append(signal, signalRow{Layers: off.Layers, Bottom: off.Bottom, Without: off, With: on})
	}
	if asJSON {
		printJSON(map[string]any{"flaky_requests": requests, "multiply": rows, "signal": signal, "mixed": mixed})
		return
	}
	fmt.Println("Attempts reaching a bottom service that always answers 503, per top-level request,")
	fmt.Println("through k services that each retry with 3 attempts")
	fmt.Printf("%-3s %16s %18s %20s %22s\n", "k", "every layer", "every layer,", "one retrying layer", "one retrying layer,")
	fmt.Printf("%-3s %16s %18s %20s %22s\n", "", "(1 request)", "default budgets", "(100 requests)", "default budgets")
	for _, r := range rows {
		fmt.Printf("%-3d %16.0f %18.2f %20.2f %22.2f\n", r.Layers, r.EveryLayer, r.EveryLayerBudgets, r.OneLayer, r.OneLayerBudgets)
	}
	fmt.Println("(the budgeted columns: 1,000 requests each, in one sustained outage)")

	fmt.Println()
	fmt.Println("Every layer retrying (3 attempts, no budget), with and without retryhttp.Handler,")
	fmt.Printf("in front of a bottom that is down or fails 30%% of attempts at random (%d requests a flaky chain)\n", requests)
	fmt.Printf("%-3s %-7s %36s   %36s\n", "", "", "without the signal", "with retryhttp.Handler")
	fmt.Printf("%-3s %-7s %12s %12s %10s   %12s %12s %10s\n", "k", "bottom", "attempts/req", "most/req", "success", "attempts/req", "most/req", "success")
	for _, r := range signal {
		fmt.Printf("%-3d %-7s %12.2f %12d %9.1f%%   %12.2f %12d %9.1f%%\n", r.Layers, r.Bottom,
			r.Without.AttemptsPerRequest, r.Without.MostAttempts, 100*r.Without.SuccessRate,
			r.With.AttemptsPerRequest, r.With.MostAttempts, 100*r.With.SuccessRate)
	}
	fmt.Println()
	fmt.Println("Four layers under the signal but one, bottom down: attempts at the bottom per request")
	for _, m := range mixed {
		fmt.Printf("  layer %d without the middleware: %.0f\n", m.Without, m.AttemptsPerRequest)
	}
}
