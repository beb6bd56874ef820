package retryhttp

import (
	"testing"
	"testing/synctest"
	"time"

	rht "github.com/herdproof/retryhttp/retryhttptest"
)

func TestHedging(t *testing.T) {
	slow := func(code int) rht.Step { return rht.Status(code).WithDelay(200 * time.Millisecond).WithBody("slow") }
	fast := rht.Status(200).WithBody("fast")
	tests := []struct {
		name     string
		steps    []rht.Step
		method   string
		policy   Policy
		budget   int
		took     time.Duration
		body     string
		attempts int
		hedges   int
		won      bool
		refused  int
		tokens   int
	}{
		{"a slow copy: the hedge wins and pays for itself", []rht.Step{slow(200), fast}, "GET", Policy{}, 500,
			10 * time.Millisecond, "fast", 2, 1, true, 0, 500},
		{"slow for everyone: the first copy wins, the hedge is paid", []rht.Step{slow(200)}, "GET", Policy{}, 500,
			200 * time.Millisecond, "slow", 2, 1, false, 0, 500 - HedgeCost + SuccessReward},
		{"budget too low: no hedge", []rht.Step{slow(200)}, "GET", Policy{}, HedgeCost - 1,
			200 * time.Millisecond, "slow", 1, 0, false, 1, HedgeCost - 1}, // full: the reward is capped
		{"two hedges allowed", []rht.Step{slow(200), slow(200), fast}, "GET", Policy{MaxHedges: 2}, 500,
			20 * time.Millisecond, "fast", 3, 2, true, 0, 500 - HedgeCost + SuccessReward}, // the winner refunded
		{"hedges count against MaxAttempts", []rht.Step{slow(200), slow(200), fast}, "GET", Policy{MaxHedges: 5, MaxAttempts: 2}, 500,
			200 * time.Millisecond, "slow", 2, 1, false, 0, 500 - HedgeCost + SuccessReward},
		{"a keyless POST is never hedged", []rht.Step{slow(200), fast}, "POST", Policy{NoIdempotencyKeys: true}, 500,
			200 * time.Millisecond, "slow", 1, 0, false, 0, 500},
		{"a keyed POST is hedged with the same key and body", []rht.Step{slow(201), rht.Status(201).WithBody("fast")}, "POST", Policy{}, 500,
			10 * time.Millisecond, "fast", 2, 1, true, 0, 500},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				base := rht.NewTransport(tc.steps...)
				p := tc.policy
				p.HedgeDelay = 10 * time.Millisecond
				budget := NewBudget(tc.budget)
				var hooks []Attempt
				tr := &Transport{Base: base, Policy: p, Budget: budget, OnAttempt: func(a Attempt) { hooks = append(hooks, a) }}
				start := time.Now()
				_, body, err := roundTrip(t, tr, newReq(t, tc.method, "payload"))
				if err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); took != tc.took || body != tc.body {
					t.Errorf("got %q after %v; want %q after %v", body, took, tc.body, tc.took)
				}
				rht.AssertAttempts(t, base, tc.attempts)
				if a := hooks[len(hooks)-1]; a.Hedges != tc.hedges || a.HedgeWon != tc.won || a.HedgesRefused != tc.refused {
					t.Errorf("got %d hedges (won %v, %d refused); want %d (won %v, %d refused)", a.Hedges, a.HedgeWon, a.HedgesRefused, tc.hedges, tc.won, tc.refused)
				}
				if got := budget.Available(); got != tc.tokens {
					t.Errorf("got %d tokens; want %d", got, tc.tokens)
				}
				if got := base.OpenBodies(); got != 0 {
					t.Errorf("got %d response bodies open; want 0 (the losers drained and closed)", got)
				}
				if tc.method == "POST" && tc.attempts > 1 {
					rht.AssertStableKey(t, base)
					for i, a := range base.Attempts() {
						if a.Body != "payload" {
							t.Errorf("copy %d: got body %q; want payload", i+1, a.Body)
						}
					}
				}
			})
		})
	}
}

func TestHedgeThenRetry(t *testing.T) {
	// Both copies of the first attempt fail with 503: the retry logic takes
	// over, with backoff, for the attempt left.
	synctest.Test(t, func(t *testing.T) {
		slow503 := rht.Status(503).WithDelay(50 * time.Millisecond)
		base := rht.NewTransport(slow503, slow503, rht.Status(200))
		var rep Report
		req := newReq(t, "GET", "")
		req = req.WithContext(WithReport(req.Context(), &rep))
		tr := &Transport{Base: base, Policy: Policy{HedgeDelay: 10 * time.Millisecond, Rand: lowRand}}
		code, _, err := roundTrip(t, tr, req)
		if err != nil || code != 200 {
			t.Fatalf("got (%d, %v); want 200", code, err)
		}
		rht.AssertAttempts(t, base, 3)
		if len(rep.Attempts) != 2 || rep.Attempts[0].Hedges != 1 || rep.Attempts[1].Number != 3 {
			t.Errorf("got attempts %v; want a hedged first attempt (copies 1 and 2), then attempt 3", rep.Attempts)
		}
	})
}
