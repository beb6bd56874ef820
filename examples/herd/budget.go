package main

import (
	"fmt"

	"github.com/herdproof/retryhttp"
	"github.com/herdproof/retryhttp/internal/herd"
)

// quotaKind is one failure kind of docs/budget.md's break-even tables.
type quotaKind struct {
	Kind      string       `json:"kind"`
	Status    int          `json:"status"`
	Cost      int          `json:"cost"`
	BreakEven float64      `json:"break_even"`
	Requests  int          `json:"requests"`
	Points    []quotaPoint `json:"points"`
}

type quotaPoint struct {
	Offset       float64 `json:"offset"` // from the break-even point
	P            float64 `json:"p"`
	Retries      int     `json:"retries"`
	Refused      int     `json:"refused"`
	RefusedShare float64 `json:"refused_share"`
	MinLeft      int     `json:"min_left"`
}

// steadyRow is one budget of docs/budget.md's steady-failure table.
type steadyRow struct {
	Budget string       `json:"budget"`
	Cells  []steadyCell `json:"cells"`
}

type steadyCell struct {
	P                  float64 `json:"p"`
	RefusedShare       float64 `json:"refused_share"`
	AttemptsPerRequest float64 `json:"attempts_per_request"`
}

// outageRow is one budget of docs/budget.md's outage table.
type outageRow struct {
	Budget string `json:"budget"`
	// In the outage: retries made, and attempts per request.
	Retries            int     `json:"outage_retries"`
	AttemptsPerRequest float64 `json:"outage_attempts_per_request"`
	// PeakRetriesPerSecond is the most retries made in one second of it.
	PeakRetriesPerSecond int `json:"outage_peak_retries_per_second"`
	// After the outage: retries refused, and the last second with a
	// refusal, counted from its end (nil: none refused).
	RefusedAfter   int   `json:"refused_after"`
	RefusingUntil  *int  `json:"refusing_until_seconds"`
	PerSecondRetry []int `json:"retries_per_second"`
}

var offsets = []float64{-0.10, -0.05, -0.02, -0.01, 0, 0.01, 0.02, 0.05, 0.10, 0.20}

// quota drives a default Transport (3 attempts, a fresh 500-token Budget,
// zero waits) around the break-even point of each failure kind.
func quota(requests int) []quotaKind {
	noWait := retryhttp.Policy{Rand: func(int64) int64 { return 0 }}
	var out []quotaKind
	for _, kind := range []struct {
		name   string
		status int
		cost   int
	}{{"transient", 503, retryhttp.RetryCost}, {"throttling", 429, retryhttp.ThrottleRetryCost}} {
		k := quotaKind{Kind: kind.name, Status: kind.status, Cost: kind.cost, BreakEven: herd.BreakEven(kind.cost), Requests: requests}
		for i, off := range offsets {
			q := herd.DriveQuota(noWait, k.BreakEven+off, kind.status, requests, uint64(i+1))
			k.Points = append(k.Points, quotaPoint{Offset: off, P: q.P, Retries: q.Retries, Refused: q.Refused,
				RefusedShare: q.RefusedShare(), MinLeft: q.MinLeft})
		}
		out = append(out, k)
	}
	return out
}

var steadyP = []float64{0.05, 0.10, 0.15, 0.20, 0.25, 0.30, 0.50}

// compare runs docs/budget.md's comparison of the token bucket and the
// ratio budgets, 100 requests a second, 3 attempts.
func compare() ([]steadyRow, []outageRow) {
	const rate = 100
	var steady []steadyRow
	for _, kind := range herd.Budgets {
		row := steadyRow{Budget: kind.Name}
		for i, p := range steadyP {
			s := herd.BudgetRun(kind, []herd.Phase{{Seconds: 60, P: p}}, rate, uint64(i+1))
			tot := herd.Totals(s, 0, len(s))
			row.Cells = append(row.Cells, steadyCell{P: p,
				RefusedShare:       float64(tot.Refused) / float64(max(tot.Retries+tot.Refused, 1)),
				AttemptsPerRequest: float64(tot.Attempts) / float64(tot.Requests)})
		}
		steady = append(steady, row)
	}
	var outage []outageRow
	for _, kind := range herd.Budgets {
		s := herd.BudgetRun(kind, herd.OutageTimeline, rate, 1)
		out := herd.Totals(s, 30, 90)
		after := herd.Totals(s, 90, 150)
		row := outageRow{Budget: kind.Name, Retries: out.Retries,
			AttemptsPerRequest: float64(out.Attempts) / float64(out.Requests), RefusedAfter: after.Refused}
		for _, x := range s[30:90] {
			row.PeakRetriesPerSecond = max(row.PeakRetriesPerSecond, x.Retries)
		}
		for _, x := range s {
			row.PerSecondRetry = append(row.PerSecondRetry, x.Retries)
		}
		for _, x := range s[90:] {
			if x.Refused > 0 {
				until := x.T - 90 + 1
				row.RefusingUntil = &until
			}
		}
		outage = append(outage, row)
	}
	return steady, outage
}

func runBudget(requests int, asJSON bool) {
	kinds := quota(requests)
	steady, outage := compare()
	if asJSON {
		printJSON(map[string]any{"quota": kinds, "steady": steady, "outage": outage})
		return
	}
	for _, k := range kinds {
		fmt.Printf("%s (%d), %d tokens a retry: p* = %.4f\n", k.Kind, k.Status, k.Cost, k.BreakEven)
		fmt.Printf("  %-10s %-8s %10s %10s %10s %12s\n", "p", "", "retries", "refused", "refused %", "fewest left")
		for _, q := range k.Points {
			fmt.Printf("  %-10.4f p*%+-6.2f %10d %10d %9.2f%% %12d\n", q.P, q.Offset, q.Retries, q.Refused, 100*q.RefusedShare, q.MinLeft)
		}
		fmt.Println()
	}
	fmt.Println("The token bucket beside the ratio budget, 100 requests a second, 3 attempts, transient failures")
	fmt.Println()
	fmt.Println("Steady failure rate p for 60 s: share of wanted retries refused, attempts per request")
	fmt.Printf("  %-30s", "budget")
	for _, p := range steadyP {
		fmt.Printf("   p=%.2f      ", p)
	}
	fmt.Println()
	for _, r := range steady {
		fmt.Printf("  %-30s", r.Budget)
		for _, c := range r.Cells {
			fmt.Printf(" %5.1f%% %5.3fx ", 100*c.RefusedShare, c.AttemptsPerRequest)
		}
		fmt.Println()
	}
	fmt.Println()
	fmt.Println("30 s healthy (p=0.01), a 60 s outage (p=1), 60 s recovered (p=0.05)")
	fmt.Printf("  %-30s %16s %17s %20s %18s %16s\n", "budget", "outage retries", "outage att./req", "most retries in 1 s", "refused after it", "refusing until")
	for _, r := range outage {
		fmt.Printf("  %-30s %16d %16.3fx %20d %18d %16s\n", r.Budget, r.Retries, r.AttemptsPerRequest, r.PeakRetriesPerSecond, r.RefusedAfter, refusingUntil(r.RefusingUntil))
	}
}

// refusingUntil says when the budget last refused a retry after the
// outage: "never" when it refused none.
func refusingUntil(s *int) string {
	if s == nil {
		return "never"
	}
	return fmt.Sprintf("%d s after", *s)
}
