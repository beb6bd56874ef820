package main

import (
	"testing"
	"time"

	"github.com/herdproof/retryhttp"
)

// The fleet's shared bucket bounds the retries of all 20 clients together
// to about one bucket's drain; private buckets let each client spend its own.
func TestFleetBoundsRetries(t *testing.T) {
	addr, stop, err := redisAddr()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	cfg := config{Clients: 20, Rate: 50, Warm: 200 * time.Millisecond, Outage: time.Second, Recover: 200 * time.Millisecond}
	drain := int64(retryhttp.DefaultBudgetTokens / retryhttp.RetryCost) // 35
	private := run(cfg, func(int) retryhttp.Budget { return retryhttp.NewTokenBucket(retryhttp.DefaultBudgetTokens) })
	fleet := runFleet(cfg, addr, "test:fleet")
	t.Logf("private: %+v; fleet: %+v (overshoot %d, fallbacks %d)", private, fleet, *fleet.Overshoot, *fleet.Fallbacks)
	if fleet.Retries > 2*drain+2 {
		t.Errorf("fleet: got %d retries; want at most %d, two buckets' drain", fleet.Retries, 2*drain+2)
	}
	if private.Retries < 15*drain {
		t.Errorf("private: got %d retries; want at least %d, 15 buckets' drain", private.Retries, 15*drain)
	}
}
