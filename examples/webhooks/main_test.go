package main

import (
	"strings"
	"testing"
	"time"
)

func TestIsolationGoals(t *testing.T) {
	// A smaller fleet than the command's: 40 endpoints, 2 down and 1
	// throttling, 200 deliveries each. Per host, the healthy endpoints
	// never have a retry refused, the sick ones get at most 1.2 attempts a
	// delivery, a destination costs at most 2 KiB; shared, the sick ones
	// cost the healthy ones their retries.
	if testing.Short() {
		t.Skip("delivers 16,000 events over loopback")
	}
	cfg := config{destinations: 40, perDest: 200, down: 0.05, throttling: 0.01, flaky: 0.1, workers: 128, timeout: 2 * time.Second, seed: 1}
	out := run(cfg, nil)
	if out.Down != 2 || out.Throttling != 1 || out.Requests != 8000 {
		t.Fatalf("got %d down, %d throttling, %d requests; want 2, 1, 8000", out.Down, out.Throttling, out.Requests)
	}
	if len(out.Runs) != 2 || out.Runs[0].Name != "shared" || out.Runs[1].Name != "per-host" {
		t.Fatalf("got runs %+v; want shared, then per-host", out.Runs)
	}
	shared, perHost := out.Runs[0], out.Runs[1]
	t.Logf("shared %.1f s, per host %.1f s", shared.Seconds, perHost.Seconds)
	if perHost.HealthyRetriesRefused != 0 {
		t.Errorf("per host: got %d healthy retries refused; want 0", perHost.HealthyRetriesRefused)
	}
	if perHost.SickAttemptsPerRequest > 1.2 {
		t.Errorf("per host: got %.3f attempts per delivery to sick endpoints; want at most 1.2", perHost.SickAttemptsPerRequest)
	}
	if perHost.HeapBytesPerDestination > 2048 || perHost.HeapBytesPerDestination <= 0 {
		t.Errorf("per host: got %.0f bytes per destination; want some, at most 2,048", perHost.HeapBytesPerDestination)
	}
	if shared.HealthyRetriesRefused == 0 || shared.HealthySuccessRate >= perHost.HealthySuccessRate {
		t.Errorf("shared: got %d healthy refusals, %.4f success (per host %.4f); want the problem shown", shared.HealthyRetriesRefused, shared.HealthySuccessRate, perHost.HealthySuccessRate)
	}
	if lines := findings(out); len(lines) == 0 || !strings.HasPrefix(lines[0], "Shared, the sick endpoints spent") {
		t.Errorf("got findings %q; want them to lead with what the shared run lost", lines)
	}
}

func TestFindingsFollowTheNumbers(t *testing.T) {
	// When the shared run refuses nothing more than the per-host one, the
	// findings do not claim it did.
	out := Output{Runs: []Result{
		{Name: "shared", HealthySuccessRate: 0.99, HealthyRetriesRefused: 0, SickAttemptsPerRequest: 1.1},
		{Name: "per-host", HealthySuccessRate: 0.99, HealthyRetriesRefused: 0, SickAttemptsPerRequest: 1.1, HeapBytesPerDestination: 400},
	}}
	lines := findings(out)
	if len(lines) == 0 || strings.Contains(lines[0], "spent the one budget") {
		t.Errorf("got %q; want no claim that the shared budget was spent", lines)
	}
}
