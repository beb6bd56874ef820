package bench

import (
	"testing"
)

// TestHedgingGoals runs a smaller version of the hedging comparison
// (cmd/hedge) and asserts what hedging must do, with margins for a busy
// machine: on the tail workload, p99 at least 5x lower than without
// hedging at no more than 10% extra requests; on the slow-all workload, at
// most 5% extra requests over the whole run.
func TestHedgingGoals(t *testing.T) {
	if testing.Short() {
		t.Skip("real time: several seconds")
	}
	cfg := DefaultHedgeConfig
	cfg.TailRequests, cfg.SlowRequests = 1000, 200
	runs := map[string]HedgeRun{}
	for _, r := range HedgeComparison(cfg) {
		runs[r.Workload+"/"+r.Name] = r
		t.Logf("%s/%s: p50 %.1f ms, p99 %.1f ms, p99.9 %.1f ms, %.3f requests a request (%.3f in the second half)",
			r.Workload, r.Name, r.P50, r.P99, r.P999, r.RequestsPerRequest, r.SteadyRequestsPerRequest)
	}
	// The comparison with failsafe-go is the hedging matrix's
	// (lab/runs/hedging-matrix.json, 5 seeds, no -race); one short run under
	// -race on a shared machine asserts only what hedging must do.
	none, ours := runs["tail/none"], runs["tail/retryhttp"]
	if ours.P99*5 > none.P99 {
		t.Errorf("tail: got p99 %.1f ms with hedging, %.1f ms without; want at least 5x lower", ours.P99, none.P99)
	}
	if ours.RequestsPerRequest > 1.10 {
		t.Errorf("tail: got %.3f requests a request; want at most 1.10", ours.RequestsPerRequest)
	}
	if slow := runs["slow-all/retryhttp"]; slow.RequestsPerRequest > 1.05 {
		t.Errorf("slow-all: got %.3f requests a request; want at most 1.05, from the first request on (the hedge share)", slow.RequestsPerRequest)
	}
}
